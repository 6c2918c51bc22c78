"""bench/lib/objstore_listing.py behind bench/lib/objstore_static.py (no moto): coordl.ImageFolder over a
synthetic bucket sends exactly the LIST pages its listing needs and lists exactly the synthetic keys
(classes, targets, sizes, walk order), one prefix at a time and in parallel."""

from __future__ import annotations

import pytest

N, CLASSES = 3001, 3  # 1001 + 1000 + 1000 objects: 2 + 1 + 1 pages of <= 1000 keys


def test_synthetic_keys_are_imagenet_like_and_sorted(listing):
    keys = listing.synthetic_keys(N, CLASSES)
    assert len(set(keys)) == N and keys == sorted(keys)
    classes = sorted({k.split("/")[1] for k in keys})
    assert [sum(k.split("/")[1] == c for k in keys) for c in classes] == [1001, 1000, 1000]
    for k in keys:
        top, cls, name = k.split("/")
        assert top == "train" and len(cls) == 9 and cls[0] == "n" and cls[1:].isdigit()
        assert name.startswith(cls + "_") and name.endswith(".JPEG") and name[10:-5].isdigit()
    assert keys == listing.synthetic_keys(N, CLASSES)  # seeded: the server's process builds the same


@pytest.mark.parametrize("in_flight", [1, 8])
def test_imagefolder_lists_the_synthetic_bucket_with_exact_pages(listing, static, in_flight):
    """The root check lists the root once (1 page: 3 prefixes; list_classes answers from it), then
    each class prefix takes ceil(objects / 1000) pages: 1 + 2 + 1 + 1 = 5 ListObjectsV2 requests, nothing else;
    the dataset holds every key once, classes sorted, files of a class in name order (so _10016
    before _9, as a local walk sorts), with the sizes the listing gave."""
    import coordl

    keys = [k.removeprefix("train/") for k in listing.synthetic_keys(N, CLASSES)]
    expected = sorted(keys, key=lambda k: k.split("/"))
    names = sorted({k.split("/")[0] for k in keys})
    proxy = static.StaticProxyProcess(None, {}, latency=0.0, listing=(N, CLASSES)).start()
    try:
        options = {"endpoint_url": proxy.url, "key": "k", "secret": "s"}
        ds = coordl.ImageFolder("s3://bench/train", storage_options=options, max_in_flight=in_flight,
                                manifest_cache="off")
        assert proxy.counts == {"GET": 1 + 2 + 1 + 1}
        assert proxy.routes == {"static": 0, "moto": 0, "listing": 5}
        if in_flight == 1:
            assert proxy.max_in_flight == 1
    finally:
        proxy.stop()
    m = ds.manifest
    assert ds.classes == names and len(ds) == N
    assert [m.relpath(i) for i in range(len(m))] == expected
    assert ds.targets == [names.index(k.split("/")[0]) for k in expected]
    assert m.sizes.tolist() == [listing.SyntheticBucket.size(f"train/{k}") for k in expected]
    ds.objects.store.close()


def test_class_prefixes_are_listed_at_once(static):
    """With latency on every page and max_in_flight=8, the 3 class prefixes' first pages are held
    at the proxy together (one at a time: never more than one)."""
    import coordl

    proxy = static.StaticProxyProcess(None, {}, latency=0.2, listing=(30, CLASSES)).start()
    try:
        options = {"endpoint_url": proxy.url, "key": "k", "secret": "s"}
        ds = coordl.ImageFolder("s3://bench/train", storage_options=options, max_in_flight=8, manifest_cache="off")
        assert len(ds) == 30 and proxy.counts == {"GET": 1 + 3}
        assert proxy.max_in_flight == 3
    finally:
        proxy.stop()
    ds.objects.store.close()
