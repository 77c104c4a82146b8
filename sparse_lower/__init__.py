"""sparse_lower: lower sparse convolutions in ONNX graphs for onnxruntime and accelerators.

    import sparse_lower
    lowered = sparse_lower.lower("model.onnx", target="gpu")
    session = sparse_lower.create_session(lowered)
    segments = sparse_lower.partition(sparse_lower.lower("model.onnx", target="nna", max_active=100_000))
"""

from . import reference
from .api import lower, partition
from .errors import SparseLowerError
from .frames import run_frames
from .importers import import_model
from .exporter import export
from .partition import Partition
from .quantization.gpu import quantize
from .runtime import create_session, cuda_library_path, get_library_path
from .tuning import tune
from .version import VERSION as __version__

__all__ = ["Partition", "SparseLowerError", "__version__", "create_session", "cuda_library_path", "export", "get_library_path",
           "import_model", "lower", "partition", "quantize", "reference", "run_frames", "tune"]
