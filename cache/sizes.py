"""Sizes in bytes, both ways: `parse_size` reads '8GiB', `fmt_bytes` writes '8.0 GiB'.

The one place for both: the caches (`minio.MinIOCache`, `partitioned.PartitionedCache`),
the loader's ``cache=``, and the command line's ``--cache`` flags and tables read and write
sizes through here.
"""

from __future__ import annotations

import re
from typing import Any

from coordl.errors import ConfigError

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)


def parse_size(value: Any, param: str = "cache") -> int:
    """Bytes from an int or a size string: '8GiB', '8G' (powers of 1024), '8GB' (powers of 1000).

    `param` names the parameter or flag in the `ConfigError` a bad value raises.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ConfigError(f"{param}={value!r} must be a positive number of bytes")
        return value
    m = _SIZE.match(value) if isinstance(value, str) else None
    if m is None:
        raise ConfigError(f"{param}={value!r} is not a size: pass bytes as an int, or a string "
                          "such as '512MiB', '8GiB' or '8GB'")
    number, prefix, binary, b = m.groups()
    unit = _UNITS[prefix.lower() + ("b" if b and not binary and prefix else "")]
    size = int(float(number) * unit)
    if size <= 0:
        raise ConfigError(f"{param}={value!r} must be more than 0 bytes")
    return size


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; whole bytes below 1 KiB ('512 B'), GiB at most ('2048.0 GiB')."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def fmt_mib(n: float) -> str:
    """1.5 * 2**20 -> '1.5 MiB': a fixed unit, for columns and rates that are compared."""
    return f"{n / 2**20:.1f} MiB"
