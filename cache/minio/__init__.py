"""The MinIO room: the static shared-memory cache of one node (CoorDL's MinIO).

- `cache`: `MinIOCache`, the API, admission (first items until full, never evicted) and the
  lifecycle NOTE.
- `layout`: the bytes inside a segment (header, index, arena) and how they are published.
- `admin`: list, drop and clean up segments (`coordl cache ...`, `coordl cleanup`).
"""

from .cache import MinIOCache

__all__ = ["MinIOCache"]
