"""A synthetic bucket that answers S3 listings from memory, for listing benches at ImageNet scale.

    bucket = SyntheticBucket("bench", "train", n=1_281_000, classes=1000)
    bucket.keys                         # sorted: train/n01440764/n01440764_10026.JPEG, ...
    bucket.size(key), bucket.etag(key)  # what its listing says of each (a function of the key)
    bucket.answer("GET", "/bench?list-type=2&prefix=train%2F&delimiter=%2F")  # (status, headers, body) or None

Keys: `classes` ImageNet-like class prefixes (`n` + 8 digits) under `prefix`/, n objects spread over
them as evenly as the division allows (the first n % classes get one more), each named
<class>_<number>.JPEG with distinct numbers (so string order is not number order, as in ImageNet);
seeded, so the server process and the bench that checks its listing build the same keys. Sizes
(10 KB-250 KB) and ETags (MD5 of the key) are derived from the key, not stored: 1,281,000 keys cost
~150 MB of strings and nothing else.

Answered (what s3fs's listing path sends, in the XML botocore parses):
- ListObjectsV2, `GET /<bucket>?list-type=2`: prefix, delimiter (CommonPrefixes, each counted once
  against max-keys, the keys under it skipped), max-keys (at most and by default 1000),
  continuation-token (opaque: the next key, base64), start-after, encoding-type=url (keys and
  prefixes then URL-encoded, EncodingType echoed); KeyCount, IsTruncated, NextContinuationToken;
  each entry's Key, LastModified, ETag, Size, StorageClass. Keys in code-point order = UTF-8 byte
  order, S3's.
- HeadBucket (`HEAD /<bucket>`), HeadObject of a key (Content-Length, ETag, Last-Modified);
  404 for another bucket, or a key it does not hold.
- Nothing else: `answer` returns None (no object bytes, no writes, no ListObjects v1, no versions).
Not part of the library: coordl never imports it.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import random
import urllib.parse
from xml.sax.saxutils import escape

LAST_MODIFIED = "2026-01-01T00:00:00.000Z"
LAST_MODIFIED_HTTP = "Thu, 01 Jan 2026 00:00:00 GMT"
MAX_KEYS = 1000
_XML = (b"Content-Type", b"application/xml")


def synthetic_keys(n: int, classes: int, prefix: str = "train", seed: int = 0) -> list[str]:
    """The bucket's keys (see the module docstring), sorted."""
    rng = random.Random(seed)
    wnids = sorted(f"n{w:08d}" for w in rng.sample(range(1_000_000, 16_000_000), classes))
    keys = []
    for i, wnid in enumerate(wnids):
        count = n // classes + (i < n % classes)
        keys.extend(f"{prefix}/{wnid}/{wnid}_{k}.JPEG" for k in rng.sample(range(1, max(60_000, 2 * count)), count))
    keys.sort()
    return keys


def _error(status: int, code: str, message: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    return status, [_XML], (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                            f"<Message>{message}</Message></Error>").encode()


class SyntheticBucket:
    """See the module docstring."""

    def __init__(self, bucket: str, prefix: str, n: int, classes: int, seed: int = 0) -> None:
        self.bucket = bucket
        self.keys = synthetic_keys(n, classes, prefix, seed)
        self.lists = 0  # ListObjectsV2 pages answered

    @staticmethod
    def size(key: str) -> int:
        return 10_000 + int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big") % 240_000

    @staticmethod
    def etag(key: str) -> str:
        return f'"{hashlib.md5(key.encode()).hexdigest()}"'

    def answer(self, method: str, target: str) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
        """(status, headers, body) of a request it answers (the module docstring), else None. A HEAD's
        body is empty and its Content-Length is in the headers."""
        path, _, query = target.partition("?")
        bucket, _, key = urllib.parse.unquote(path.lstrip("/")).partition("/")
        params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        if method == "HEAD" and not key.strip("/") and not query:
            return (200, [], b"") if bucket == self.bucket else (404, [], b"")
        if method == "HEAD" and not query:
            i = bisect.bisect_left(self.keys, key)
            if bucket != self.bucket or i == len(self.keys) or self.keys[i] != key:
                return 404, [], b""
            return 200, [(b"Content-Type", b"binary/octet-stream"), (b"ETag", self.etag(key).encode()),
                          (b"Last-Modified", LAST_MODIFIED_HTTP.encode()), (b"Accept-Ranges", b"bytes"),
                          (b"Content-Length", str(self.size(key)).encode())], b""
        if method == "GET" and not key.strip("/") and params.get("list-type") == "2":
            if bucket != self.bucket:
                return _error(404, "NoSuchBucket", "The specified bucket does not exist")
            self.lists += 1
            return 200, [_XML], self._list(params)
        return None

    def _list(self, params: dict[str, str]) -> bytes:
        prefix, delimiter = params.get("prefix", ""), params.get("delimiter", "")
        max_keys = min(int(params.get("max-keys", MAX_KEYS)), MAX_KEYS)
        token, start_after = params.get("continuation-token"), params.get("start-after", "")
        url = params.get("encoding-type") == "url"

        def enc(s: str) -> str:
            return urllib.parse.quote(s, safe="/") if url else escape(s)

        keys = self.keys
        i = bisect.bisect_left(keys, prefix)
        if start_after:
            i = max(i, bisect.bisect_right(keys, start_after))
        if token is not None:
            i = bisect.bisect_left(keys, base64.urlsafe_b64decode(token.encode()).decode())
        contents, prefixes, count = [], [], 0
        while i < len(keys) and keys[i].startswith(prefix) and count < max_keys:
            k = keys[i]
            cut = k.find(delimiter, len(prefix)) if delimiter else -1
            if cut >= 0:  # a common prefix: once, then past every key under it
                common = k[:cut + len(delimiter)]
                prefixes.append(f"<CommonPrefixes><Prefix>{enc(common)}</Prefix></CommonPrefixes>")
                i = bisect.bisect_left(keys, common[:-1] + chr(ord(common[-1]) + 1))
            else:
                etag = self.etag(k).replace('"', "&quot;")
                contents.append(f"<Contents><Key>{enc(k)}</Key><LastModified>{LAST_MODIFIED}</LastModified>"
                                f"<ETag>{etag}</ETag><Size>{self.size(k)}</Size>"
                                "<StorageClass>STANDARD</StorageClass></Contents>")
                i += 1
            count += 1
        truncated = i < len(keys) and keys[i].startswith(prefix)
        head = [f"<Name>{escape(self.bucket)}</Name>", f"<Prefix>{enc(prefix)}</Prefix>",
                f"<KeyCount>{count}</KeyCount>", f"<MaxKeys>{max_keys}</MaxKeys>",
                f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"]
        if delimiter:
            head.append(f"<Delimiter>{enc(delimiter)}</Delimiter>")
        if url:
            head.append("<EncodingType>url</EncodingType>")
        if token is not None:
            head.append(f"<ContinuationToken>{escape(token)}</ContinuationToken>")
        if truncated:
            next_token = base64.urlsafe_b64encode(keys[i].encode()).decode()
            head.append(f"<NextContinuationToken>{next_token}</NextContinuationToken>")
        if start_after:
            head.append(f"<StartAfter>{enc(start_after)}</StartAfter>")
        return ('<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult '
                'xmlns="http://s3.amazonaws.com/doc/2006-03-01/">' + "".join(head + contents + prefixes)
                + "</ListBucketResult>").encode()
