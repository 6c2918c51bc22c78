"""coordl: a data loader for PyTorch that removes data stalls.

    import coordl
    ds = coordl.ImageFolder("/data/imagenet/train", transform="train")
    loader = coordl.DataLoader(ds, batch_size=256, shuffle=True, num_workers=8)
"""

from .caching import MinIOCache
from .dataset import ImageFolder, PreparedBatch
from .errors import CacheError, ConfigError, CoordinatorError, CoordlError, DatasetError, SampleError
from .loader import DataLoader, collate

__version__ = "0.1.0"

__all__ = [
    "DataLoader", "ImageFolder", "MinIOCache", "PreparedBatch", "collate",
    "CoordlError", "ConfigError", "DatasetError", "SampleError", "CacheError", "CoordinatorError",
]
