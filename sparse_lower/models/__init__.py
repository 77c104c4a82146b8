"""Builders of sample models and reference networks, with deterministic weights.

They live inside the package (not in a top-level `models/` folder) so that the installed command
line can build its demo model, but apart from the compiler: `import sparse_lower` never loads them;
the commands and tools that run a reference network (`sparse-lower demo`, `sparse-lower bench`,
tools/, the tests) import this package when they run. The frame they run on is data, read by
sparse_lower/frames/sample.py; the ONNX graph they write is built with sparse_lower/graph_writer.py.

A reference network (`sp_middle_resnet_fhd`, `voxelnext`, `sparse_unet`, `patent_2d_stack`, `patent_example`) is a
function of an emitter (emitter.py) and a NumPy generator; the emitter picks the form it is built in:
`CanonicalEmitter` (source ops, what the compiler takes), `NvidiaEmitter` / `AimetEmitter`
(the formats in the wild, what the importers take).
"""

from .builder import SparseModelBuilder
from .canonical import CanonicalEmitter
from .centerpoint import sp_middle_resnet_fhd
from .emitter import Dense, Emitter, Sparse
from .formats import AimetEmitter, NvidiaEmitter
from .patent2d import patent_2d_stack, patent_example
from .samples import SmallNetwork, centerpoint_head_stack, small_networks
from .unet import sparse_unet
from .voxelnext import HEAD_CHANNELS, voxelnext

__all__ = ["AimetEmitter", "CanonicalEmitter", "Dense", "Emitter", "NvidiaEmitter", "SmallNetwork", "Sparse",
           "SparseModelBuilder", "centerpoint_head_stack", "patent_2d_stack", "patent_example", "small_networks",
           "sp_middle_resnet_fhd", "sparse_unet", "voxelnext", "HEAD_CHANNELS"]
