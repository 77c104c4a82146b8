"""The gpu target's compute form: IndexedUnfold → MatMul (→ IndexedFold), or all three in IndexedConv."""

from .compute import GpuCompute

__all__ = ["GpuCompute"]
