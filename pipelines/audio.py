"""Audio samples: WAV/FLAC bytes -> one fixed-length float32 window (channels, samples).

Planning is separate from the work, as for image crops (pipelines/crop.py):
`window_offset` is a pure function of the clip's length, the window's length,
the transform and the item's generator (`pipelines/crop.py`'s `item_rng(seed, epoch, index)`);
`window` decodes with soundfile and cuts.

- ``"train"``: a random offset in ``[0, frames - length]``, drawn from the item's
  generator, so it changes with the epoch and not with the number of workers.
- ``"val"``: the centred window, offset ``(frames - length) // 2``.
- A clip shorter than the window starts at sample 0 and is zero-padded at the end
  (both transforms).
- A file at another sample rate is resampled with soxr (HQ): the window is that
  of the whole clip resampled to the target rate (offsets count target samples),
  computed from the source frames under it plus a margin (`source_span`).
  Without soxr installed, such a file is refused with a `ConfigError` that names
  both rates and the fix.
- Only the frames under the window are decoded (a seek, then one read), plus the
  last frame, so that a cut-short file is refused whatever window was drawn;
  damage inside the file but outside the window is not seen (soundfile itself
  would only see it when decoding those frames).
- A WAV cut short is refused before decoding (`wav_cut_short`): libsndfile takes a
  data chunk that declares more bytes than the file holds at the file's word and
  reads the shorter clip, which the window would zero-pad.

Pipelines know samples, never where bytes come from: errors raised here name
the problem and leave the file name to the dataset (coordl/datasets/audio.py).
"""

from __future__ import annotations

import io
import math
import random
import struct

import numpy as np

from coordl.errors import ConfigError, SampleError

TRANSFORMS = ("train", "val")
#: source context decoded either side of a window that is resampled (the filter's reach)
MARGIN_SECONDS = 0.05
MARGIN_FRAMES = 256


def soundfile():
    """The soundfile module, or a ConfigError that says how to install it."""
    try:
        import soundfile as sf
    except ImportError as e:
        raise ConfigError(f"audio needs the soundfile package ({e}): pip install 'coordl[audio]' "
                          "(or pip install soundfile)") from None
    except OSError as e:  # the package is there but libsndfile is not
        raise ConfigError(f"soundfile cannot load libsndfile ({e}): install libsndfile1 "
                          "(apt-get install libsndfile1) or a soundfile wheel that bundles it") from None
    return sf


def _soxr():
    try:
        import soxr
    except ImportError:
        return None
    return soxr


def window_length(sample_rate: int, seconds: float) -> int:
    """Samples in a window of `seconds` at `sample_rate` (rounded to the nearest sample)."""
    return max(1, int(round(sample_rate * seconds)))


def window_offset(frames: int, length: int, transform: str, rng: random.Random | None) -> int:
    """Where item's window starts in a clip of `frames` samples: random ("train", from `rng`),
    centred ("val"), 0 when the clip is no longer than the window."""
    if frames <= length:
        return 0
    if transform == "train":
        if rng is None:
            raise ConfigError("transform='train' draws the window's offset from the item's generator: "
                              "pass rng=item_rng(seed, epoch, index) (pipelines/crop.py)")
        return rng.randrange(frames - length + 1)
    return (frames - length) // 2


def source_span(frames: int, rate: int, sample_rate: int, offset: int, length: int) -> tuple[int, int, int]:
    """The source frames [lo, hi) to decode for the window at `offset` (target rate), and where
    the window starts in them once resampled (`skip`).

    At the target rate that is the window itself. At another rate, the span reaches
    `MARGIN_SECONDS` past the window either side (the resampling filter's context) and
    starts on a source frame whose time is a whole number of target samples, so the
    window equals the same window of the whole clip resampled (to float rounding;
    tests/pipelines/test_audio.py checks 1e-6), at a fraction of the decode and resample.
    """
    if rate == sample_rate:
        return offset, min(frames, offset + length), 0
    step = rate // math.gcd(rate, sample_rate)
    margin = max(MARGIN_FRAMES, int(MARGIN_SECONDS * rate))
    lo = max(0, offset * rate // sample_rate - margin)
    lo -= lo % step
    hi = min(frames, -(-(offset + length) * rate // sample_rate) + margin)
    return lo, hi, offset - lo * sample_rate // rate


def resampled_frames(frames: int, rate: int, sample_rate: int) -> int:
    """A clip's length once resampled (what soxr gives for the whole clip)."""
    return frames if rate == sample_rate else round(frames * sample_rate / rate)


def window(raw, sample_rate: int, length: int, transform: str, rng: random.Random | None,
           channels: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Item's window as float32 (channels, length), written into `out` when given.

    `channels`: None keeps the file's; 1 averages the file's channels; n > 1 takes a
    file with n channels or repeats a mono one (anything else is a SampleError).
    """
    sf = soundfile()
    cut = wav_cut_short(raw)
    if cut is not None:
        declared, held, size = cut
        raise SampleError(f"truncated WAV: its data chunk declares {declared} bytes and the file "
                          f"({size} bytes) holds {held} of them (a cut-short copy or download?)")
    try:
        with sf.SoundFile(io.BytesIO(raw)) as f:
            rate, frames, file_channels = int(f.samplerate), int(f.frames), int(f.channels)
            if rate != sample_rate:
                _need_soxr(rate, sample_rate)
            offset = window_offset(resampled_frames(frames, rate, sample_rate), length, transform, rng)
            lo, hi, skip = source_span(frames, rate, sample_rate, offset, length)
            if lo:
                f.seek(lo)
            data = f.read(hi - lo, dtype="float32", always_2d=True)
            if len(data) == hi - lo and hi < frames:  # a cut-short file is refused whatever the window
                f.seek(frames - 1)
                if len(f.read(1, dtype="float32")) != 1:
                    raise SampleError(f"corrupt audio: the header promises {frames} frames and "
                                      "the last one cannot be decoded (a cut-short file?)")
    except (ConfigError, SampleError):
        raise
    except sf.SoundFileError as e:
        raise SampleError(f"not a WAV/FLAC file soundfile can read ({_reason(e)})") from None
    except (RuntimeError, ValueError, TypeError) as e:
        raise SampleError(f"corrupt audio ({type(e).__name__}: {e})") from None
    if len(data) != hi - lo:
        raise SampleError(f"corrupt audio: the header promises {frames} frames and only "
                          f"{len(data)} of the {hi - lo} asked for could be decoded")
    if rate != sample_rate:
        data = resample(data, rate, sample_rate)[skip:skip + length]
    data = _mix(data, file_channels, channels)
    if out is None:
        out = np.zeros((data.shape[1], length), dtype=np.float32)
    else:
        out[:, len(data):] = 0
    out[:, :len(data)] = data.T
    return out


def wav_cut_short(raw) -> tuple[int, int, int] | None:
    """(bytes the data chunk declares, bytes of it the file holds, file size) of a RIFF/WAVE file
    whose data chunk runs past the end of the file; None for a whole WAV or any other file.

    Walks the chunks up to ``data``. A declared size of 0 or 0xFFFFFFFF (a writer that
    streamed and never came back to the header) says nothing and is left to libsndfile.
    """
    view = memoryview(raw)
    if len(view) < 12 or bytes(view[8:12]) != b"WAVE" or bytes(view[:4]) not in (b"RIFF", b"RIFX"):
        return None
    order = "<" if bytes(view[:4]) == b"RIFF" else ">"
    pos = 12
    while pos + 8 <= len(view):
        chunk = bytes(view[pos:pos + 4])
        (size,) = struct.unpack_from(order + "I", view, pos + 4)
        pos += 8
        if chunk == b"data":
            held = len(view) - pos
            return (size, held, len(view)) if size not in (0, 0xFFFFFFFF) and size > held else None
        pos += size + (size & 1)  # chunks are padded to an even length
    return None


def _need_soxr(rate: int, sample_rate: int):
    """The soxr module, or a ConfigError naming both rates and the fix."""
    soxr = _soxr()
    if soxr is None:
        raise ConfigError(f"a file at {rate} Hz needs resampling to sample_rate={sample_rate}, and "
                          "soxr is not installed: pip install 'coordl[audio]' (or pip install soxr), "
                          f"or convert the files to {sample_rate} Hz")
    return soxr


def resample(data: np.ndarray, rate: int, sample_rate: int) -> np.ndarray:
    """(frames, channels) float32 from `rate` to `sample_rate` with soxr's HQ filter."""
    soxr = _need_soxr(rate, sample_rate)
    if len(data) == 0:
        return data
    return soxr.resample(data, rate, sample_rate, quality="HQ")


def _mix(data: np.ndarray, have: int, want: int | None) -> np.ndarray:
    if want is None or want == have:
        return data
    if want == 1:
        return data.mean(axis=1, keepdims=True, dtype=np.float32)
    if have == 1:
        return np.repeat(data, want, axis=1)
    raise SampleError(f"the file has {have} channels and channels={want} was asked for: "
                      "pass channels=1 (mix down), None (keep each file's) or the file's count")


def _reason(e: Exception) -> str:
    """libsndfile's own words, without the BytesIO repr soundfile puts in its message."""
    text = getattr(e, "error_string", None) or str(e)
    return text.split(": ", 1)[-1] if text.startswith("Error opening") else text


__all__ = ["TRANSFORMS", "resample", "soundfile", "wav_cut_short", "window", "window_length", "window_offset"]
