"""Types of the C extension pipelines/_jpegroi.c (region-of-interest JPEG decode, libjpeg-turbo)."""

from typing import Any

from typing_extensions import Buffer

def decode(data: Buffer | Any, denom: int, x0: int, y0: int, x1: int, y1: int, channels: int, /
           ) -> tuple[bytes, int, int, int, int, int, int] | None: ...
def header(data: Buffer | Any, /) -> tuple[int, int, bool]: ...
def version() -> str: ...
