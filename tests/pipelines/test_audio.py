"""pipelines/audio.py: windows equal what soundfile reads at the planned offsets; resampling; bad bytes."""

from __future__ import annotations

import io

import numpy as np
import pytest

from coordl.errors import ConfigError, SampleError
from coordl.pipelines import audio
from coordl.pipelines.crop import item_rng

sf = pytest.importorskip("soundfile")
RATE = 16000


def encode(data: np.ndarray, rate: int = RATE, fmt: str = "WAV", subtype: str = "FLOAT") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, data, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def noise(frames: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).uniform(-0.5, 0.5, (frames, channels))).astype(np.float32)


def tone(hz: float, rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(round(rate * seconds))) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)[:, None]


def decoded(raw: bytes) -> np.ndarray:
    """What soundfile reads: (frames, channels) float32."""
    return sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)[0]


@pytest.mark.parametrize("fmt,subtype", [("WAV", "FLOAT"), ("WAV", "PCM_16"), ("FLAC", "PCM_16"), ("FLAC", "PCM_24")])
def test_val_window_is_the_centred_slice(fmt, subtype):
    raw = encode(noise(25001, 2), fmt=fmt, subtype=subtype)
    got = audio.window(raw, RATE, RATE, "val", None)
    off = (25001 - RATE) // 2
    assert got.dtype == np.float32 and got.shape == (2, RATE)
    np.testing.assert_array_equal(got, decoded(raw)[off:off + RATE].T)


@pytest.mark.parametrize("fmt", ["WAV", "FLAC"])
def test_train_window_is_the_slice_at_the_items_offset_and_moves_with_the_epoch(fmt):
    raw = encode(noise(40000), fmt=fmt, subtype="PCM_16")
    full = decoded(raw)
    offsets = set()
    for epoch in range(6):
        off = audio.window_offset(40000, RATE, "train", item_rng(7, epoch, 3))
        assert 0 <= off <= 40000 - RATE
        offsets.add(off)
        got = audio.window(raw, RATE, RATE, "train", item_rng(7, epoch, 3))
        np.testing.assert_array_equal(got, full[off:off + RATE].T)
        # a pure function of (seed, epoch, item)
        np.testing.assert_array_equal(got, audio.window(raw, RATE, RATE, "train", item_rng(7, epoch, 3)))
    assert len(offsets) == 6


@pytest.mark.parametrize("transform", ["train", "val"])
def test_a_shorter_clip_starts_at_zero_and_is_zero_padded(transform):
    clip = noise(5000, 2, seed=1)
    raw = encode(clip)
    out = np.full((2, RATE), 7.0, dtype=np.float32)  # a reused buffer: the padding must be cleared
    got = audio.window(raw, RATE, RATE, transform, item_rng(0, 0, 0), out=out)
    assert got is out
    np.testing.assert_array_equal(got[:, :5000], clip.T)
    assert not got[:, 5000:].any()


def test_channels_kept_mixed_down_or_repeated():
    stereo, mono = noise(RATE, 2, seed=2), noise(RATE, 1, seed=3)
    assert audio.window(encode(stereo), RATE, RATE, "val", None).shape == (2, RATE)
    np.testing.assert_allclose(audio.window(encode(stereo), RATE, RATE, "val", None, channels=1)[0],
                               stereo.mean(axis=1), rtol=0, atol=1e-7)
    np.testing.assert_array_equal(audio.window(encode(mono), RATE, RATE, "val", None, channels=2),
                                  np.repeat(mono.T, 2, axis=0))
    with pytest.raises(SampleError, match="2 channels and channels=3"):
        audio.window(encode(stereo), RATE, RATE, "val", None, channels=3)


def _peak_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[np.argmax(spectrum)])


@pytest.mark.parametrize("rate,fmt", [(8000, "WAV"), (44100, "FLAC"), (22050, "WAV")])
def test_resampled_files_keep_length_and_pitch(rate, fmt):
    raw = encode(tone(440.0, rate, 2.0), rate, fmt, "PCM_24" if fmt == "FLAC" else "FLOAT")
    got = audio.window(raw, RATE, RATE, "val", None)
    assert got.shape == (1, RATE) and got.dtype == np.float32
    assert abs(_peak_hz(got[0], RATE) - 440.0) <= 1.0  # 1 Hz bins over one second
    assert np.abs(got).max() == pytest.approx(0.5, abs=0.02)  # not attenuated
    assert len(audio.resample(decoded(raw), rate, RATE)) == 2 * RATE


def test_a_short_file_at_another_rate_is_resampled_then_padded():
    raw = encode(tone(300.0, 8000, 0.25), 8000)
    got = audio.window(raw, RATE, RATE, "train", item_rng(0, 0, 0))
    assert got[0, :3900].any() and not got[0, 4000:].any()


def test_without_soxr_another_rate_is_refused_naming_both_rates(monkeypatch):
    monkeypatch.setattr(audio, "_soxr", lambda: None)
    with pytest.raises(ConfigError, match=r"8000 Hz .*sample_rate=16000.*pip install"):
        audio.window(encode(tone(440.0, 8000, 1.0), 8000), RATE, RATE, "val", None)
    audio.window(encode(noise(RATE)), RATE, RATE, "val", None)  # the target rate needs no soxr


@pytest.mark.parametrize("bad,words", [
    (b"RIFF" + bytes(100), "not a WAV/FLAC file"),
    (b"not audio at all", "not a WAV/FLAC file"),
    (b"", "not a WAV/FLAC file"),
])
def test_bytes_that_are_not_audio_are_a_sample_error(bad, words):
    with pytest.raises(SampleError, match=words):
        audio.window(bad, RATE, RATE, "val", None)


def test_a_damaged_flac_is_a_sample_error():
    raw = encode(noise(3 * RATE), fmt="FLAC", subtype="PCM_16")
    damaged = raw[:300] + bytes(len(raw) - 300)
    with pytest.raises(SampleError):
        audio.window(damaged, RATE, RATE, "val", None)
    with pytest.raises(SampleError):
        audio.window(raw[: len(raw) // 2], RATE, RATE, "train", item_rng(0, 0, 1))


@pytest.mark.parametrize("subtype,width", [("PCM_16", 2), ("PCM_24", 3)])
@pytest.mark.parametrize("transform", ["train", "val"])
def test_a_wav_cut_short_is_a_sample_error_not_a_padded_clip(subtype, width, transform):
    """Its data chunk declares 96,000 bytes, the file holds 31,970: libsndfile reads the 31,926
    data bytes there are, which the 1 s window would zero-pad."""
    raw = encode(noise(96000 // width), subtype=subtype)
    assert audio.wav_cut_short(raw) is None
    cut = raw[:31970]
    assert audio.wav_cut_short(cut) == (96000, 31926, 31970)
    assert len(decoded(cut)) == 31926 // width < RATE           # what would have been padded
    with pytest.raises(SampleError, match=r"truncated WAV: its data chunk declares 96000 bytes and the "
                                          r"file \(31970 bytes\) holds 31926 of them"):
        audio.window(cut, RATE, RATE, transform, item_rng(0, 0, 1))


def test_a_whole_wav_with_a_chunk_after_its_data_is_not_cut_short():
    raw = encode(noise(RATE), subtype="PCM_16")
    odd = raw + b"LIST" + (3).to_bytes(4, "little") + b"abc" + b"\0"   # an odd-sized chunk, padded
    assert audio.wav_cut_short(odd) is None
    whole = audio.window(raw, RATE, RATE, "val", None)
    np.testing.assert_array_equal(audio.window(odd, RATE, RATE, "val", None), whole)
    assert audio.wav_cut_short(encode(noise(RATE), fmt="FLAC", subtype="PCM_16")[:500]) is None  # FLAC: not a WAV


def test_window_length_rounds_to_the_nearest_sample():
    assert audio.window_length(16000, 1.0) == 16000
    assert audio.window_length(22050, 0.5) == 11025
    assert audio.window_length(8000, 1e-9) == 1


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 44100, 48000])
@pytest.mark.parametrize("transform", ["train", "val"])
def test_a_resampled_window_equals_that_window_of_the_whole_clip_resampled(rate, transform):
    """Only the frames under the window (and a margin) are decoded and resampled: same result."""
    clip = noise(int(rate * 2.7) + 13, 2, seed=rate)
    raw = encode(clip, rate)
    whole = audio.resample(decoded(raw), rate, RATE)
    assert len(whole) == audio.resampled_frames(len(clip), rate, RATE)
    for item in range(4):
        off = audio.window_offset(len(whole), RATE, transform, item_rng(1, 0, item))
        got = audio.window(raw, RATE, RATE, transform, item_rng(1, 0, item))
        np.testing.assert_allclose(got, whole[off:off + RATE].T, rtol=0, atol=1e-6)
        lo, hi, _ = audio.source_span(len(clip), rate, RATE, off, RATE)
        assert hi - lo < len(clip) * 0.6  # not the whole clip
