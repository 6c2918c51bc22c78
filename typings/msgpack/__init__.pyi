# The part of msgpack (1.x) coordl uses, typed: msgpack ships no stubs and no py.typed, so
# pyright sees packb as returning `Unknown | None` (the pure-Python fallback's Packer). Read by
# pyright from stubPath (typings/, its default); coordl/coordinator/protocol.py validates what
# unpackb returns (Any) field by field.
from typing import Any

class UnpackException(Exception): ...

def packb(o: Any, *, use_bin_type: bool = ...) -> bytes: ...
def unpackb(packed: bytes, *, raw: bool = ..., strict_map_key: bool = ..., use_list: bool = ...) -> Any: ...
