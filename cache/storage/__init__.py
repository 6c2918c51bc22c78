"""The storage room: every reader of item bytes, wherever they live.

- `localfile`: read a local file whole (optionally dropping it from the page cache), `evict`.
- `objstore`: `ObjectStore`, objects under an fsspec URL (s3://, gs://, az://, ...): listing, concurrent
  GETs with retries; the I/O shell around `policy`.
- `policy`: the pure half of the object store: `StoreConfig`, back-off, `Retries` (the one retry loop
  of every request, async or blocking), error classes, walk order.
- `listing`: s3:// listed one page per request (s3fs or obstore), in a forked child when needed;
  an ImageFolder's selection of image objects.
- `obstoreget`: the obstore client (GETs, pages) and its per-process runtime.
- `tarindex`: the members of tar shards (WebDataset), their index file, coalesced ranged reads.
- `readers`: what a dataset reads through: `LocalFiles`, `ObjectFiles`, `RangedReads`, the one batch
  read ahead per process and this process's reader threads.

Nothing here imports the caches; the caches (`minio/`, `partitioned/`) import nothing of here.
"""
