"""coordl.ImageFolder: torchvision's attributes and outputs, fetch/prep split, fingerprint."""

import io
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

import coordl


def _torchvision_samples(root):
    """What torchvision.datasets.ImageFolder lists (its make_dataset), written out."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for idx, cls in enumerate(classes):
        for dirpath, _, fnames in sorted(os.walk(os.path.join(root, cls), followlinks=True)):
            for f in sorted(fnames):
                if f.lower().endswith((".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")):
                    samples.append((os.path.join(dirpath, f), idx))
    return classes, samples


def test_torchvision_attributes(tiny_root):
    ds = coordl.ImageFolder(tiny_root)
    classes, samples = _torchvision_samples(tiny_root)
    assert ds.classes == classes
    assert ds.class_to_idx == {c: i for i, c in enumerate(classes)}
    assert ds.samples == samples
    assert ds.imgs == samples
    assert ds.targets == [s[1] for s in samples]
    assert len(ds) == len(samples) == 40
    assert isinstance(ds, torch.utils.data.Dataset)


def test_item_is_uint8_chw_and_int_label(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="train", size=64)
    x, y = ds[5]
    assert x.dtype == torch.uint8 and tuple(x.shape) == (3, 64, 64)
    assert isinstance(y, int) and y == ds.targets[5]


def test_fetch_returns_file_bytes_and_prep_is_deterministic(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform="train", size=32, seed=3)
    raw = ds.fetch(7)
    with open(ds.samples[7][0], "rb") as f:
        assert bytes(raw) == f.read()
    a, _ = ds.prep(raw, 7, epoch=1)
    b, _ = ds.prep(raw, 7, epoch=1)
    c, _ = ds.prep(raw, 7, epoch=2)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_val_matches_direct_pillow_reference(photo_root):
    ds = coordl.ImageFolder(photo_root, transform="val", size=224)
    for i in range(0, len(ds), 3):
        with Image.open(ds.samples[i][0]) as img:
            img = img.convert("RGB")
            w, h = img.size
            short = min(w, h)
            rw, rh = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
            img = img.resize((rw, rh), Image.Resampling.BILINEAR)
            left, top = int(round((rw - 224) / 2)), int(round((rh - 224) / 2))
            ref = np.asarray(img.crop((left, top, left + 224, top + 224)), dtype=np.float32)
        del short
        ours = ds[i][0].permute(1, 2, 0).numpy().astype(np.float32)
        # large images take a DCT-scaled decode (Image.draft): not bit-equal, but no visible change
        psnr = 10 * np.log10(255.0**2 / max(float(((ours - ref) ** 2).mean()), 1e-9))
        assert psnr >= 35.0, f"item {i} ({w}x{h}): PSNR {psnr:.1f} dB against Pillow's resize + crop"


def test_train_matches_full_decode_crop_resize_flip(tiny_root):
    """Without draft, `train` is exactly crop -> resize -> flip of the full decode, up to resampling."""
    from coordl.pipelines import cpu, crop

    ds = coordl.ImageFolder(tiny_root, transform="train", size=48, seed=5)
    for i in range(0, len(ds), 4):
        raw = ds.fetch(i)
        ours = cpu.train(raw, 48, crop.item_rng(5, 0, i), draft=False)
        rng = crop.item_rng(5, 0, i)
        img = Image.open(io.BytesIO(raw)).convert("RGB")
        left, top, w, h = crop.random_resized_crop_box(*img.size, rng)
        ref = img.crop((left, top, left + w, top + h)).resize((48, 48), Image.Resampling.BILINEAR)
        if crop.flip(rng):
            ref = ref.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        err = np.abs(ours.astype(np.float32) - np.asarray(ref, dtype=np.float32))
        assert err.mean() < 1.5, f"item {i}: mean abs error {err.mean():.2f}"
        assert np.array_equal(ds.prep(raw, i, 0)[0].permute(1, 2, 0).numpy(),
                              cpu.train(raw, 48, crop.item_rng(5, 0, i)))


@pytest.mark.parametrize("mode,fmt", [("L", "JPEG"), ("CMYK", "JPEG"), ("P", "PNG"), ("RGBA", "PNG"),
                                       ("LA", "PNG"), ("RGB", "BMP"), ("RGB", "GIF"), ("RGB", "TIFF"), ("I;16", "PNG")])
def test_any_mode_and_format_becomes_rgb(tmp_path, mode, fmt):
    root = tmp_path / "ds"
    (root / "a").mkdir(parents=True)
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (90, 120, 3), dtype=np.uint8), "RGB")
    img = rgb.convert(mode) if mode != "I;16" else rgb.convert("L").convert("I;16")
    ext = {"JPEG": "jpg", "PNG": "png", "BMP": "bmp", "GIF": "gif", "TIFF": "tif"}[fmt]
    img.save(root / "a" / f"x.{ext}", fmt)
    ds = coordl.ImageFolder(root, extensions=(f".{ext}",))
    assert len(ds) == 1
    for transform in ("train", "val"):
        x, y = coordl.ImageFolder(root, transform=transform, size=32, extensions=(f".{ext}",))[0]
        assert tuple(x.shape) == (3, 32, 32) and x.dtype == torch.uint8 and y == 0
    pil, _ = coordl.ImageFolder(root, transform=None, extensions=(f".{ext}",))[0]
    assert pil.mode == "RGB" and pil.size == (120, 90)


def test_callable_transform_and_target_transform(tiny_root):
    ds = coordl.ImageFolder(tiny_root, transform=lambda im: im.size, target_transform=lambda y: y * 10)
    size, y = ds[0]
    assert size == (160, 120) and y == 0
    with pytest.raises(coordl.DatasetError, match="holds no image"):
        coordl.ImageFolder(tiny_root, transform=None, extensions=(".png",), on_error="skip")


def test_fingerprint_changes_with_files(tmp_path, tiny_root):
    root = tmp_path / "copy"
    shutil.copytree(tiny_root, root)
    fp = coordl.ImageFolder(root).fingerprint
    assert coordl.ImageFolder(root).fingerprint == fp
    victim = root / "class_0001" / sorted(os.listdir(root / "class_0001"))[0]
    data = victim.read_bytes()
    victim.write_bytes(data[:-10] + b"\0" * 10)  # same size, new content and mtime
    st = os.stat(victim)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert coordl.ImageFolder(root).fingerprint != fp


def test_bad_arguments_name_the_parameter(tiny_root):
    with pytest.raises(coordl.ConfigError, match="transform='train2'"):
        coordl.ImageFolder(tiny_root, transform="train2")
    with pytest.raises(coordl.ConfigError, match="on_error='ignore'"):
        coordl.ImageFolder(tiny_root, on_error="ignore")
    with pytest.raises(coordl.ConfigError, match="size=0"):
        coordl.ImageFolder(tiny_root, size=0)


def test_a_persisted_manifest_gives_the_same_dataset(tmp_path, tiny_root):
    """`manifest_cache=` and `rescan=` reach coordl.manifest.build.scan; a loaded manifest is the scanned one."""
    from coordl.manifest import build as manifest

    root = tmp_path / "copy"
    shutil.copytree(tiny_root, root)
    old = 1_600_000_000 * 10**9
    for dirpath, _, _ in os.walk(root):
        os.utime(dirpath, ns=(old, old))          # an old tree: its folders are past the racy window
    store = str(tmp_path / "manifests")
    before = dict(manifest.SCANS)
    scanned = coordl.ImageFolder(root, manifest_cache=store)
    loaded = coordl.ImageFolder(root, manifest_cache=store)
    forced = coordl.ImageFolder(root, manifest_cache=store, rescan=True)
    assert {k: manifest.SCANS[k] - before[k] for k in before} == {"walks": 2, "loads": 1}
    assert loaded.manifest.source.startswith(store) and scanned.manifest.source == "scan"
    for ds in (loaded, forced):
        assert ds.samples == scanned.samples and ds.classes == scanned.classes
        assert ds.fingerprint == scanned.fingerprint
        assert bytes(ds.fetch(3)) == bytes(scanned.fetch(3))


@pytest.mark.parametrize("transform", ["train", "val"])
def test_size_height_width_gives_batches_of_b_3_h_w(tiny_root, transform):
    from coordl.pipelines import cpu, crop

    ds = coordl.ImageFolder(tiny_root, transform=transform, size=(40, 24), seed=2)
    assert ds.size == (40, 24) and "size=(40, 24)" in repr(ds)
    x, _ = ds[3]
    raw = ds.fetch(3)
    want = cpu.train(raw, (40, 24), crop.item_rng(2, 0, 3)) if transform == "train" else cpu.val(raw, (40, 24))
    assert x.shape == (3, 40, 24) and np.array_equal(x.permute(1, 2, 0).numpy(), want)
    batches = {}
    for workers in (0, 2):
        loader = coordl.DataLoader(ds, batch_size=6, num_workers=workers, shuffle=False)
        batches[workers] = [(b.clone(), y.clone()) for b, y in loader]
        assert [tuple(b.shape) for b, _ in batches[workers]] == [(6, 3, 40, 24)] * 6 + [(4, 3, 40, 24)]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(batches[0], batches[2]))
    assert torch.equal(batches[0][0][0][3], x)


def test_a_square_height_width_is_the_int_size(tiny_root):
    for size in ((32, 32), [32, 32], (np.int64(32), np.int64(32))):
        ds = coordl.ImageFolder(tiny_root, transform="train", size=size)
        assert ds.size == 32 and type(ds.size) is int
    assert torch.equal(coordl.ImageFolder(tiny_root, size=(32, 32))[5][0],
                       coordl.ImageFolder(tiny_root, size=32)[5][0])


@pytest.mark.parametrize("size", [0, -1, True, 1.5, "224", (224,), (224, 160, 3), (0, 160), (224, True),
                                  (224.0, 160), None])
def test_a_size_that_is_not_an_int_or_height_width_is_refused_by_name(tiny_root, size):
    with pytest.raises(coordl.ConfigError, match=r"size=.* must be a positive int \(height = width\) or "
                                                  r"\(height, width\).*size=\(224, 160\)"):
        coordl.ImageFolder(tiny_root, size=size)


def test_non_square_sizes_are_refused_clearly_where_only_square_is_made(tiny_root):
    from coordl.coordinator.client import _check_dataset
    from coordl.pipelines import dali

    ds = coordl.ImageFolder(tiny_root, transform="train", size=(40, 24))
    with pytest.raises(coordl.ConfigError, match=r"size=\(40, 24\): the DALI backend makes square images "
                                                  r"only.*backend='cpu'"):
        dali.Recipe(ds.transform, ds.size, ds.seed)
    with pytest.raises(coordl.ConfigError, match=r"coordinator=.*size=\(40, 24\).*drop coordinator="):
        _check_dataset(ds, 4)
