"""The NVIDIA DALI CPU baseline of the loader benchmark, written as DALI's users write it.

    fn.readers.file -> fn.decoders.image_random_crop(device="cpu")   (fused ROI decode)
                    -> fn.resize(224x224, antialiased linear)
                    -> fn.crop_mirror_normalize(dtype=UINT8, CHW, random mirror)

with ``device_id=None`` (no GPU) and ``num_threads`` = the benchmark's
worker count, read through DALI's own PyTorch iterator. Variants:

- ``fused``: the pipeline above with DALI's defaults.
- ``tuned``: the same pipeline with the settings DALI's docs recommend for
  throughput: the dynamic executor, a deeper prefetch queue and one more
  thread than cores (DALI's main thread only schedules).
"""

from __future__ import annotations

VARIANTS = {
    "fused": {"threads_extra": 0, "pipe": {}},
    "tuned": {"threads_extra": 1, "pipe": {"exec_dynamic": True, "prefetch_queue_depth": 3}},
}


def build(root: str, batch_size: int, threads: int, variant: str = "fused", size: int = 224):
    """A DALIGenericIterator over `root` (ImageFolder layout) and the number of files."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    cfg = VARIANTS[variant]

    @pipeline_def(batch_size=batch_size, num_threads=threads + cfg["threads_extra"],
                  device_id=None, seed=0, **cfg["pipe"])
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(
            jpegs, device="cpu", output_type=types.RGB,
            random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)
        images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR,
                           antialias=True)
        images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                          mirror=fn.random.coin_flip(probability=0.5))
        return images, labels

    p = pipe()
    p.build()
    it = DALIGenericIterator([p], ["images", "labels"], reader_name="Reader",
                             last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=False)
    return it, int(p.epoch_size("Reader"))
