"""The gpu target's compute form: IndexedUnfold → MatMul (→ IndexedFold)."""

from .compute import GpuCompute

__all__ = ["GpuCompute"]
