"""`coordl.cache`: where an item's encoded bytes come from. Knows bytes, never pixels.

- `storage`: read a file, optionally without leaving it in the page cache.
- `objstore`: objects under an fsspec URL (s3://, gs://, ...): parallel listing, concurrent GETs with
  retries (`objstore_policy`: its pure half: config, back-off, error classes, redaction).
- `minio`: the MinIO static cache (API, admission, lifecycle NOTE).
- `layout`: the bytes inside a cache segment (header, index, arena).
- `shm`: segment files: names, free space, creation, OFD locks, liveness.
- `admin`: list, drop and clean up segments (`coordl cache ...`, `coordl cleanup`).
- `checksum`: the xxh3-64 every cached value carries (MinIO and Redis alike).
- `partitioned`: the partitioned cache over the servers' Redis cache nodes (client side).
- `placement`: which node owns an item: rendezvous hashing, pure.
- `redisnode`: starting, checking and describing a Redis cache node (`coordl cache-node`).
"""
