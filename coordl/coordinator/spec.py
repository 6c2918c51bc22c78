"""What one row of the coordinator's ring holds: the sample spec (shape, dtype).

Every row of the ring is one sample's tensor of a fixed shape and dtype (beside
it the ring keeps the sample's int label and item id, ring.py). The daemon
decides the spec once, at start, from what it serves:

- an image dataset (``coordl serve --data DIR``: an ImageFolder; or a dataset
  that names its size, `served_as`, such as WebDataset): rows are uint8
  (N, N, 3) with N its size, and the job gets (B, 3, N, N), a permuted view
  (`hwc`), as coordl's collate gives images;
- ``coordl serve --dataset pkg.mod:Class --size N`` (a user's dataset whose prep
  returns uint8 images (3, N, N) or (N, N, 3)): the same, as before sample specs;
- ``coordl serve --dataset pkg.mod:Class`` without --size (coordl.AudioFolder, a
  user's dataset of vectors, ...): the dataset's `sample_spec()`
  (coordl/datasets/base.py: by default item 0 prepared once), any shape of at
  most 7 dimensions and a dtype of `SAMPLE_DTYPES`; the job gets (B, *shape)
  as a local coordl.DataLoader collates them.

A prep worker checks every sample it writes against the spec (base.py
`prep_samples`: a sample of another shape or dtype fails its batch, naming it).
The spec travels in Welcome (the job builds its views of the ring from it) and
in `coordl status`; a job says its own dataset's in Hello, and one whose spec
differs from a dataset-given spec is refused naming both (hello.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coordl.datasets.base import CoordlDataset
from coordl.errors import ConfigError

from . import protocol as p

SAMPLE_DTYPES = p.SAMPLE_DTYPES


@dataclass(frozen=True)
class SampleSpec:
    shape: tuple[int, ...]   # one row of the ring (an image ring's: (N, N, 3))
    dtype: str               # its numpy dtype name, one of SAMPLE_DTYPES
    hwc: bool = False        # rows are uint8 (N, N, 3) images, handed to jobs as (3, N, N)

    @classmethod
    def image(cls, size: int) -> SampleSpec:
        return cls((size, size, 3), "uint8", True)

    @property
    def delivered(self) -> tuple[int, ...]:
        """The shape of one sample of a job's batch."""
        return (self.shape[2], self.shape[0], self.shape[1]) if self.hwc else self.shape

    @property
    def size(self) -> int:
        """An image ring's N (`coordl status`'s size); 0 for other samples."""
        return self.shape[0] if self.hwc else 0

    def describe(self) -> str:
        """'float32 (1, 8000)': what a job's samples are."""
        return f"{self.dtype} {self.delivered}"

    def wire(self) -> tuple[list[int], str, bool]:
        """(sample_shape, sample_dtype, sample_hwc) as Welcome carries them."""
        return list(self.shape), self.dtype, self.hwc

    @classmethod
    def from_wire(cls, shape: list[int], dtype: str, hwc: bool) -> SampleSpec:
        return cls(tuple(int(d) for d in shape), dtype, bool(hwc))


def is_image_dataset(dataset: Any) -> bool:
    """A dataset that names its own output size (ImageFolder, WebDataset: `served_as`), whose
    samples are uint8 images of that size; a user's CoordlDataset subclass is not one."""
    return type(dataset).served_as is not CoordlDataset.served_as


def image_size(dataset: Any, what: str) -> int:
    """An image dataset's square output size, or a ConfigError."""
    size = dataset.served_as()[2]
    if isinstance(size, bool) or not isinstance(size, int):  # ImageFolder(size=(h, w)) with h != w
        raise ConfigError(f"{what} serves square batches (coordl serve --size N): this dataset has "
                          f"size={size!r}; pass size=<one int>, or load without coordinator=")
    return size


def dataset_spec(dataset: Any, what: str) -> SampleSpec:
    """The spec of `dataset`'s samples: an image dataset's from its size, any other's from its
    `sample_spec()` (checked: a dtype of SAMPLE_DTYPES, at most 7 dimensions)."""
    if is_image_dataset(dataset):
        return SampleSpec.image(image_size(dataset, what))
    name = f"{type(dataset).__module__}:{type(dataset).__qualname__}"
    got = dataset.sample_spec()
    said = "" if type(dataset).sample_spec is not CoordlDataset.sample_spec else " (its first item's, prepared)"
    try:
        shape, dtype = got
        shape = tuple(int(d) for d in shape)
        p.check_sample(list(shape), str(dtype))
    except (TypeError, ValueError, p.ProtocolError) as e:
        raise ConfigError(
            f"{what}: {name}.sample_spec() gave {got!r}{said}, which the coordinator's ring cannot hold "
            f"({e}): each sample must be (tensor, int label) with a tensor of one fixed shape (at "
            f"most {p.MAX_SAMPLE_DIMS} dimensions) and a dtype among {', '.join(SAMPLE_DTYPES)}: "
            f"cast in prep (e.g. .to(torch.float32)), or load without coordinator=") from None
    return SampleSpec(shape, str(dtype))


def served_spec(dataset: Any, size: int | None, what: str) -> SampleSpec:
    """The daemon's spec: `dataset_spec`, except that --size N given with a user's dataset
    declares uint8 images of N (served as (B, 3, N, N), as before sample specs)."""
    if size is not None and not is_image_dataset(dataset):
        return SampleSpec.image(size)
    return dataset_spec(dataset, what)
