"""Builders of sample models in the source-op form (DESIGN.md §3), with deterministic weights.

They live inside the package (not in a top-level `models/` folder) so that the installed command
line can build its demo model.
"""

from .builder import SparseModelBuilder
from .samples import centerpoint_head_stack

__all__ = ["SparseModelBuilder", "centerpoint_head_stack"]
