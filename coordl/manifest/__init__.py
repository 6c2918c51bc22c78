"""The manifest room: the sorted list of items and the fingerprint that names the dataset.

- build.py: `scan` and `Manifest`: load the persisted manifest of an unchanged root, or walk the tree and persist it
- walk.py: the directory walk (a thread pool over class folders; `_statnames.c` stats one folder in C)
- identity.py: what the fingerprint covers, and how a same-size edit with its mtime restored is caught
- store.py: the persisted manifest: where it lives and when it is reused
- threads.py: the thread pool the walk uses
"""

from .build import IMG_EXTENSIONS, SCANS, Manifest, scan

__all__ = ["IMG_EXTENSIONS", "SCANS", "Manifest", "scan"]
