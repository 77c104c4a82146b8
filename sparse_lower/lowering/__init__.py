"""Lowering rules: one module per source op (rules/), written as match / check / rewrite, and the
compute form each target gives a conv (gpu/, nna/). `rules(target, options)` assembles them."""

from __future__ import annotations

from .context import LoweringContext, Options
from .gpu import GpuCompute
from .nna import COMBINES, LAYOUTS, NnaCompute
from .rules.sparse_conv import SparseConvRule
from .rules.sparse_deconv import SparseDeconvRule
from .rules.submanifold_conv import SubmanifoldConvRule
from .rules.to_dense import ToDenseRule
from .rules.to_sparse import ToSparseRule

TARGETS = ("gpu", "nna", "hybrid")
STRATEGIES = ("auto", "unfold", "rulebook", "fused")


def _gpu_compute(strategy: str) -> GpuCompute:
    """The gpu compute form. `auto` is `fused` (measured by `sparse-lower bench`): like the rulebook
    it multiplies only the pairs that exist, where the unfold multiplies K per output (1.6–3.6× the
    pairs on the real frames, up to 8× for strided and transposed convs), and it moves no `[pairs, C]`
    matrix through memory between a gather, a MatMul and a fold. Over the rulebook it took the
    CenterPoint backbone from 601 to 416 ms on 2 threads. A conv reading a dense input gets the
    rulebook (see GpuCompute)."""
    return GpuCompute("fused" if strategy == "auto" else strategy)


def _policy(target: str, options: Options):
    """Which compute form each conv gets. hybrid: the patent's sequence — the first sparse layer of
    every branch on the gpu path (it may read the dense input directly), the following layers on the
    nna path."""
    gpu = _gpu_compute(options.strategy)
    nna = NnaCompute(options.combine, options.max_active, options.fuse_taps, options.layout)
    if target == "gpu":
        return lambda node, ctx: gpu
    if target == "nna":
        return lambda node, ctx: nna
    return lambda node, ctx: nna if ctx.after_a_sparse_layer(node.inputs[0]) else gpu


def rules(target: str, options: Options) -> list:
    """The rules of `target`, in the order they are tried on a node. The boundary ops always take
    the custom ops: an accelerator cannot look coordinates up."""
    choose = _policy(target, options)
    return [ToSparseRule(), SubmanifoldConvRule(choose), SparseConvRule(choose), SparseDeconvRule(choose),
            ToDenseRule()]


__all__ = ["COMBINES", "LAYOUTS", "STRATEGIES", "TARGETS", "LoweringContext", "Options", "rules"]
