"""Drop-in parity with torch: subscriptable, no descriptors for plain datasets, explicit marker."""

import subprocess
import sys
import textwrap

import torch

import coordl
from coordl.loader.dataloader import is_coordl_dataset


def test_subscriptable_like_torch():
    alias = coordl.DataLoader[int]
    assert alias.__origin__ is coordl.DataLoader
    assert issubclass(coordl.DataLoader, torch.utils.data.DataLoader)


def test_1100_live_loaders_under_ulimit_1024():
    script = textwrap.dedent("""
        import resource, torch, coordl
        from torch.utils.data import TensorDataset
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
        data = TensorDataset(torch.arange(10))
        loaders = [coordl.DataLoader(data, batch_size=2) for _ in range(1100)]
        assert sum(len(list(x)) for x in loaders[:3]) == 15
        assert loaders[0].stats()["storage_reads"] == 0
        print(len(loaders))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1100"


class _LooksLikeOne(torch.utils.data.Dataset):
    """A user's dataset that happens to have fetch/prep/set_epoch: not a coordl dataset."""

    def __init__(self):
        self.epochs = []

    def fetch(self, i):
        return i

    def prep(self, raw, i, epoch=None):
        return raw

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return i


def test_a_user_dataset_with_fetch_prep_set_epoch_is_left_untouched():
    ds = _LooksLikeOne()
    before = dict(vars(ds))
    assert not is_coordl_dataset(ds)
    loader = coordl.DataLoader(ds, batch_size=4, num_workers=0)
    assert loader.dataset is ds
    for _ in range(2):
        batches = list(loader)
    assert [type(b) for b in batches] == [torch.Tensor, torch.Tensor]   # torch's collate, plain ints in
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5]]
    assert ds.epochs == [] and vars(ds) == before                        # set_epoch never called, nothing set
