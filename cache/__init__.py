"""`coordl.cache`: where an item's encoded bytes come from. Knows bytes, never pixels.

Three rooms, and the primitives they share beside them:

- `storage/`: every reader of item bytes. `localfile` (a file, optionally without leaving it in
  the page cache), `objstore` (`ObjectStore`: objects under an fsspec URL, concurrent GETs), its
  pure `policy` (config, back-off, the one retry loop `Retries`, error classes), `listing`
  (s3:// page by page), `obstoreget` (the obstore GET client), `tarindex` (members of tar shards,
  ranged reads), `readers` (`LocalFiles`, `ObjectFiles`, `RangedReads`: what a dataset reads
  through, the batch read ahead, the reader threads).
- `minio/`: the MinIO static cache on one node. `cache` (`MinIOCache`: API, admission, lifecycle
  NOTE), `layout` (the bytes inside a segment), `admin` (list, drop and clean up segments).
- `partitioned/`: the partitioned cache over the servers' Redis cache nodes. `cache`
  (`PartitionedCache`, client side), `placement` (which node owns an item), `membership`,
  `mgetread` and `recycle` (the MGET reader), `nodehealth`, and the nodes themselves: `redisnode`,
  `nodeproc`, `nodeurl`, `nodetls`, `certdates`.
- shared: `shm` (segment files: names, free space, creation, OFD locks, liveness), `forkguard`
  (`ForkGuard`: the one fork guard), `sizes` (parse and print byte sizes), `checksum` (the xxh3-64
  every cached value carries), `redact` (the one credential redactor for URLs and messages),
  `indexfile` (the one atomic "magic + length + checksum" index file).

Public entry points: `coordl.cache.minio.MinIOCache`, `coordl.cache.partitioned.PartitionedCache`,
`coordl.cache.storage.objstore.ObjectStore` (users reach the first two as `coordl.MinIOCache` and
`coordl.PartitionedCache`).
"""
