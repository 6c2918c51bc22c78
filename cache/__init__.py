"""`coordl.cache`: where an item's encoded bytes come from. Knows bytes, never pixels.

- `storage`: read a file, optionally without leaving it in the page cache.
- `minio`: the MinIO static cache (API, admission, lifecycle NOTE).
- `layout`: the bytes inside a cache segment (header, index, arena).
- `shm`: segment files: names, free space, creation, OFD locks, liveness.
- `admin`: list, drop and clean up segments (`coordl cache ...`, `coordl cleanup`).
"""
