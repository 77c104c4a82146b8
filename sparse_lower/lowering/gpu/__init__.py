"""The gpu target: index-builder custom ops → IndexedUnfold → MatMul (→ IndexedFold)."""

from .context import GpuContext
from .sparse_conv import SparseConvRule
from .sparse_deconv import SparseDeconvRule
from .submanifold_conv import SubmanifoldConvRule
from .to_dense import ToDenseRule
from .to_sparse import ToSparseRule

STRATEGIES = ("auto", "unfold", "rulebook")


def rules() -> list:
    """The gpu rules, in the order they are tried on a node."""
    return [ToSparseRule(), SubmanifoldConvRule(), SparseConvRule(), SparseDeconvRule(), ToDenseRule()]


__all__ = ["GpuContext", "STRATEGIES", "rules"]
