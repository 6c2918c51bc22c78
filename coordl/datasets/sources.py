"""How a dataset chooses and configures its reader (the readers themselves: cache/storage/readers.py):
the `read_ahead` argument, whether a root is a URL, opening an ImageFolder at a URL, and a command
line's `--storage-options`."""

from __future__ import annotations

from typing import Any, TypeGuard

from coordl.cache.storage.objstore import ObjectStore
from coordl.cache.storage.readers import ObjectFiles


def check_read_ahead(read_ahead: object) -> bool | None:
    """`read_ahead` as ImageFolder and WebDataset take it, or a ConfigError naming it."""
    from coordl.errors import ConfigError

    if read_ahead is not None and not isinstance(read_ahead, bool):
        raise ConfigError(f"read_ahead={read_ahead!r} must be True, False or None (on with obstore)")
    return read_ahead


def reads_ahead(read_ahead: bool | None, store: ObjectStore) -> bool:
    """Does a dataset with this `read_ahead` read ahead through `store`? None: with obstore only."""
    return bool(read_ahead) or (read_ahead is None and store.fetch_client == "obstore")


def is_url(root: object) -> TypeGuard[str]:
    """Is `root` an fsspec URL (``scheme://...``, file:// aside) rather than a local path?"""
    from coordl.manifest import objects

    return objects.is_url(root)


def open_source(url: str, extensions: Any, is_valid_file: Any, allow_empty: bool, rescan: bool,
                manifest_cache: Any, storage_options: dict | None, max_in_flight: int,
                fetch_client: str | None = None) -> tuple[Any, ObjectFiles]:
    """(the manifest, an ObjectFiles) of the ImageFolder at `url` (coordl/manifest/objects.py)."""
    from coordl.errors import ConfigError
    from coordl.manifest import objects
    from coordl.manifest.build import IMG_EXTENSIONS

    if is_valid_file is not None:
        raise ConfigError(f"is_valid_file is not supported for a dataset at a URL ({url.split('://')[0]}://...): "
                          "pass extensions=(...) to choose the objects")
    manifest, store = objects.scan_url(url, extensions or IMG_EXTENSIONS, allow_empty, storage_options=storage_options,
                                       max_in_flight=max_in_flight, rescan=rescan, manifest_cache=manifest_cache,
                                       fetch_client=fetch_client)
    return manifest, ObjectFiles(manifest, store)


def parse_storage_options(text: str | None, flag: str = "--storage-options") -> dict | None:
    """A command line's `--storage-options JSON` as a dict (None when not given). Without it, s3://
    reads the AWS_* environment variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...) as s3fs does.
    The value is never echoed back: it may hold a secret."""
    import json

    from coordl.errors import ConfigError

    if text is None or text == "":
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{flag} is not JSON ({e.msg} at character {e.pos}): pass an object such as "
                          "'{\"endpoint_url\": \"http://127.0.0.1:9000\"}' (credentials are better left to "
                          "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object (keys such as endpoint_url, anon), not a "
                          f"{type(value).__name__}")
    return value
