"""coordl.AudioFolder with coordl.DataLoader: windows equal what soundfile reads at the same offsets;
the same batches for 0 and 2 workers; counts; on_error; the MinIO cache; resume; rank shares."""

from __future__ import annotations

import gc
import json
import os

import numpy as np
import pytest
from coordl_tests_loaderhelp import batches_of, epoch_batches_counts

import coordl
from coordl.pipelines import audio
from coordl.pipelines.crop import item_rng

sf = pytest.importorskip("soundfile")
RATE = 16000


def _noise(frames: int, channels: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.5, 0.5, (frames, channels)).astype(np.float32)


def _tone(hz: float, rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(round(rate * seconds))) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)[:, None]


#: (class, file, data, rate, subtype): WAV and FLAC, mono and stereo, 8 kHz and 44.1 kHz, two shorter than 1 s
FILES = [
    ("noise", "a.wav", _noise(24000, 1, 1), RATE, "FLOAT"),
    ("noise", "b.flac", _noise(30000, 1, 2), RATE, "PCM_16"),
    ("noise", "c.wav", _noise(9000, 1, 3), RATE, "PCM_16"),      # shorter: zero-padded
    ("noise", "d.wav", _noise(20000, 2, 4), RATE, "FLOAT"),      # stereo
    ("noise", "e.flac", _noise(17000, 2, 5), RATE, "PCM_24"),    # stereo
    ("tone", "f.wav", _tone(440.0, 8000, 1.5), 8000, "FLOAT"),   # resampled
    ("tone", "g.flac", _tone(440.0, 44100, 1.2), 44100, "PCM_24"),  # resampled
    ("tone", "h.wav", _tone(1000.0, RATE, 0.4), RATE, "FLOAT"),  # shorter
    ("tone", "i.flac", _tone(220.0, RATE, 2.0), RATE, "PCM_16"),
]


@pytest.fixture
def audio_root(tmp_path) -> str:
    root = tmp_path / "audio"
    for cls, name, data, rate, subtype in FILES:
        (root / cls).mkdir(parents=True, exist_ok=True)
        sf.write(str(root / cls / name), data, rate, subtype=subtype)
    return str(root)




def _soundfile_window(path: str, frames_offset: int, length: int) -> np.ndarray:
    """The mono window soundfile reads at `frames_offset` (channels averaged), zero-padded."""
    data = sf.read(path, dtype="float32", always_2d=True)[0][frames_offset:frames_offset + length]
    out = np.zeros(length, dtype=np.float32)
    out[:len(data)] = data.mean(axis=1, dtype=np.float32)
    return out


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.equal(u) and y.equal(v) for (x, y), (u, v) in zip(a, b))


@pytest.mark.parametrize("transform", ["train", "val"])
def test_windows_equal_what_soundfile_reads_at_the_same_offsets(audio_root, transform):
    ds = coordl.AudioFolder(audio_root, transform=transform, seed=3, channels=1)
    assert ds.classes == ["noise", "tone"] and len(ds) == len(FILES)
    for epoch in (0, 1):
        for i in range(len(ds)):
            path = ds.manifest.path(i)
            info = sf.info(path)
            wave, label = ds.prep(ds.fetch(i), i, epoch)
            assert str(wave.dtype) == "torch.float32" and tuple(wave.shape) == (1, RATE)
            assert label == (0 if "/noise/" in path else 1)
            if info.samplerate != RATE:
                continue
            rng = item_rng(3, epoch, i) if transform == "train" else None
            off = audio.window_offset(info.frames, RATE, transform, rng)
            if transform == "val":
                assert off == max(0, (info.frames - RATE) // 2)
            np.testing.assert_array_equal(wave[0].numpy(), _soundfile_window(path, off, RATE))


def test_train_offsets_move_with_the_epoch_and_val_stays(audio_root):
    train = coordl.AudioFolder(audio_root, transform="train", channels=1)
    val = coordl.AudioFolder(audio_root, transform="val", channels=1)
    i = next(k for k in range(len(train)) if train.manifest.path(k).endswith("i.flac"))  # 2 s: room to move
    raw = train.fetch(i)
    assert len({train.prep(raw, i, e)[0].numpy().tobytes() for e in range(5)}) == 5
    assert len({val.prep(raw, i, e)[0].numpy().tobytes() for e in range(5)}) == 1


def test_resampled_items_keep_their_pitch(audio_root):
    ds = coordl.AudioFolder(audio_root, transform="val", channels=1)
    for i in range(len(ds)):
        path = ds.manifest.path(i)
        if sf.info(path).samplerate == RATE:
            continue
        wave = ds[i][0][0].numpy()
        assert sf.info(path).duration > 1.0 and wave.shape == (RATE,)
        spectrum = np.abs(np.fft.rfft(wave * np.hanning(RATE)))
        assert abs(np.fft.rfftfreq(RATE, 1 / RATE)[np.argmax(spectrum)] - 440.0) <= 1.0


def test_batches_are_the_same_for_0_and_2_workers_and_counted(audio_root):
    ds = coordl.AudioFolder(audio_root, transform="train", channels=1)
    total = ds.manifest.total_bytes
    runs = {}
    for workers in (0, 2):
        loader = coordl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers)
        epochs = []
        for _ in range(2):
            batches, counts = epoch_batches_counts(loader)
            assert counts["storage_reads"] == len(ds) and counts["storage_bytes"] == total
            assert counts["decodes"] == len(ds) and counts["samples"] == len(ds)
            assert counts["errors_skipped"] == 0
            epochs.append(batches)
        x, y = epochs[0][0]
        assert tuple(x.shape) == (4, 1, RATE) and str(x.dtype) == "torch.float32" and str(y.dtype) == "torch.int64"
        assert not _same(epochs[0], epochs[1])  # another order and other windows
        runs[workers] = epochs
    assert _same(runs[0][0], runs[2][0]) and _same(runs[0][1], runs[2][1])


def test_stereo_batches_keep_channels_and_a_mixed_batch_is_refused(audio_root):
    ds = coordl.AudioFolder(audio_root, transform="val")
    stereo = [i for i in range(len(ds)) if sf.info(ds.manifest.path(i)).channels == 2]
    batch = ds.__getitems__(stereo)
    assert tuple(batch.images.shape) == (2, 2, RATE)
    with pytest.raises(coordl.ConfigError, match=r"mixes channel counts: .*a\.wav \(1 channels\).*channels=1"):
        ds.__getitems__([0] + stereo)
    up = coordl.AudioFolder(audio_root, transform="val", channels=2)
    assert tuple(up.__getitems__(list(range(len(up)))).images.shape) == (len(up), 2, RATE)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_corrupt_file_raises_naming_it_or_is_skipped_and_counted(audio_root, workers):
    bad = os.path.join(audio_root, "noise", "bad.wav")
    with open(bad, "wb") as f:
        f.write(b"RIFF" + bytes(64))
    raising = coordl.DataLoader(coordl.AudioFolder(audio_root, channels=1), batch_size=4, num_workers=workers)
    with pytest.raises(coordl.SampleError, match=r"bad\.wav: not a WAV/FLAC file"):
        for _ in raising:
            pass
    del raising  # the traceback held by pytest keeps the iterator (and its workers) alive until gc
    gc.collect()
    loader = coordl.DataLoader(coordl.AudioFolder(audio_root, channels=1, on_error="skip"),
                               batch_size=4, num_workers=workers)
    batches, counts = epoch_batches_counts(loader)
    assert counts["errors_skipped"] == 1 and counts["samples"] == len(FILES)
    assert counts["decodes"] == len(FILES) + 1
    assert sum(len(y) for _, y in batches) == len(FILES)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_wav_cut_short_raises_naming_it_or_is_skipped_and_counted(audio_root, workers):
    """WAVs written by soundfile at 16 and 24 bits, 3 s (96,000 data bytes), then cut to 31,970 bytes."""
    cut = []
    for subtype, width in (("PCM_16", 2), ("PCM_24", 3)):
        path = os.path.join(audio_root, "tone", f"cut{width * 8}.wav")
        sf.write(path, _noise(96000 // width, 1, width), RATE, subtype=subtype)
        os.truncate(path, 31970)
        cut.append(path)
    ds = coordl.AudioFolder(audio_root, channels=1)
    for path in cut:
        item = next(i for i in range(len(ds)) if ds.manifest.path(i) == path)
        loader = coordl.DataLoader(ds, batch_size=1, num_workers=workers, sampler=[item])
        with pytest.raises(coordl.SampleError, match=rf"{os.path.basename(path)}: truncated WAV: its data chunk "
                                                     r"declares 96000 bytes and the file \(31970 bytes\)"):
            for _ in loader:
                pass
        del loader
        gc.collect()
    loader = coordl.DataLoader(coordl.AudioFolder(audio_root, channels=1, on_error="skip"),
                               batch_size=4, num_workers=workers)
    batches, counts = epoch_batches_counts(loader)
    assert counts["errors_skipped"] == 2 and counts["samples"] == len(FILES)
    assert sum(len(y) for _, y in batches) == len(FILES)


def test_cache_serves_exactly_its_items_in_epoch_2(audio_root, dropped):
    ds = coordl.AudioFolder(audio_root, transform="train", channels=1)
    n, total = len(ds), ds.manifest.total_bytes
    plain = coordl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)
    loader = coordl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, cache=total // 2)
    dropped.append(loader.dataset)
    first, counts = epoch_batches_counts(loader)
    assert counts["storage_reads"] == n and counts["cache_misses"] == n and counts["cache_hits"] == 0
    state = loader.stats()
    items, cached = state["cache_items"], state["cache_bytes"]
    assert 0 < items < n and counts["cache_inserts"] == items
    second, counts = epoch_batches_counts(loader)
    assert counts["cache_hits"] == items and counts["storage_reads"] == n - items
    assert counts["storage_bytes"] == total - cached and counts["cache_inserts"] == 0
    assert _same(first, batches_of(plain)) and _same(second, batches_of(plain))  # bytes, not windows, cached


def test_resume_yields_exactly_the_remaining_batches(audio_root):
    def build():
        return coordl.DataLoader(coordl.AudioFolder(audio_root, channels=1, seed=5),
                                 batch_size=2, shuffle=True, num_workers=0)

    ref = build()
    epoch_batches_counts(ref)
    expected = epoch_batches_counts(ref)[0]
    loader = build()
    epoch_batches_counts(loader)
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    again = build()
    again.load_state_dict(state)
    rest = [(x.clone(), y.clone()) for x, y in again]
    assert _same([(x.clone(), y.clone()) for x, y in head] + rest, expected)


@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_shares_are_disjoint_and_cover_the_epoch(audio_root, drop_last):
    """9 items over 2 ranks, as torch's DistributedSampler: padded with the order's head to 10, or cut to 8."""
    ds = coordl.AudioFolder(audio_root, channels=1, transform="val")
    waves = {}
    for rank in (0, 1):
        loader = coordl.DataLoader(ds, batch_size=2, shuffle=True, rank=rank, world_size=2, drop_last=drop_last)
        waves[rank] = [w.numpy().tobytes() for x, _ in loader for w in x]
    everything = {ds[i][0].numpy().tobytes() for i in range(len(ds))}
    assert len(waves[0]) == len(waves[1]) == (4 if drop_last else 5)
    shares = set(waves[0]), set(waves[1])
    assert len(shares[0] & shares[1]) == (0 if drop_last else 1)  # the one repeated item pads
    assert shares[0] | shares[1] <= everything and len(shares[0] | shares[1]) == (8 if drop_last else 9)


def test_each_path_counts_one_read_and_one_decode_per_item(audio_root):
    # the contract's read/prep are uncounted; fetch and the batch path count once (they counted
    # twice in the coordinator's prep workers, which go through the base class's fetch and _prep)
    ds = coordl.AudioFolder(audio_root, channels=1, seconds=0.25)
    n = len(ds)
    for path in ("item", "batch", "base"):
        counted = coordl.DataLoader(ds, batch_size=4)
        if path == "item":
            for i in range(n):
                counted.dataset[i]
        elif path == "batch":
            for _ in counted:
                pass
        else:  # what a prep worker of coordl serve calls
            for i in range(n):
                counted.dataset._prep(counted.dataset.fetch(i), i, 0)
        stats = counted.stats()
        assert (stats["storage_reads"], stats["decodes"]) == (n, n), path
        assert stats["storage_bytes"] == sum(os.path.getsize(ds.manifest.path(i)) for i in range(n))


@pytest.mark.parametrize("kwargs,match", [
    ({"sample_rate": 0}, "sample_rate=0"),
    ({"sample_rate": 16000.0}, "sample_rate=16000.0"),
    ({"seconds": -1}, "seconds=-1"),
    ({"transform": "test"}, "transform='test'"),
    ({"channels": 0}, "channels=0"),
    ({"on_error": "ignore"}, "on_error='ignore'"),
])
def test_bad_arguments_are_config_errors(audio_root, kwargs, match):
    with pytest.raises(coordl.ConfigError, match=match):
        coordl.AudioFolder(audio_root, **kwargs)


def test_only_wav_and_flac_are_items(audio_root):
    with open(os.path.join(audio_root, "noise", "notes.txt"), "w") as f:
        f.write("not audio")
    assert len(coordl.AudioFolder(audio_root, rescan=True)) == len(FILES)


@pytest.mark.slow
def test_the_bench_runs_on_a_few_clips(tmp_path):
    """bench/audio.py as a user runs it: both loaders see every clip of each epoch (warm-up + 1 round)."""
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = str(tmp_path / "audio")
    proc = subprocess.run([sys.executable, os.path.join(repo, "bench", "audio.py"), "--data", str(tmp_path / "data"),
                           "--files", "8", "--clip-seconds", "1.5", "--rounds", "1", "--batch-size", "4",
                           "--out", out], cwd=repo, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out + ".json") as f:
        result = json.load(f)
    assert set(result["clips_per_s"]) == {"coordl", "torch"} and result["ratio_coordl_to_torch"]["median"] > 0
    stats = result["stats_coordl_total"]
    assert stats["storage_reads"] == stats["decodes"] == stats["samples"] == 16
    assert "coordl / torch" in open(out + ".md").read()


def test_partitioned_cache_serves_epoch_2_from_two_nodes(audio_root, redis_nodes):
    """Two cache nodes on this machine, this process as node 0: epoch 2 reads nothing from storage."""
    nodes = [redis_nodes().url, redis_nodes().url]
    cache = coordl.PartitionedCache(nodes, 0)
    ds = coordl.AudioFolder(audio_root, transform="train", channels=1)
    n = len(ds)
    loader = coordl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, cache=cache)
    plain = coordl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=0)
    first, counts = epoch_batches_counts(loader)
    assert counts["storage_reads"] == n and counts["storage_bytes"] == ds.manifest.total_bytes
    second, counts = epoch_batches_counts(loader)
    assert counts["storage_reads"] == 0 and counts["local_hits"] + counts["remote_hits"] == n
    assert counts["local_hits"] > 0 and counts["remote_hits"] > 0
    assert _same(first, epoch_batches_counts(plain)[0]) and _same(second, epoch_batches_counts(plain)[0])
    cache.close()
