"""Lowering rules: one module per source op (rules/), written as match / check / rewrite, and the
compute form each target gives a conv (gpu/, nna/). `rules(target, options)` assembles them."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from .context import LoweringContext, Options
from .gpu import GpuCompute
from .nna import COMBINES, NnaCompute
from .rules.sparse_conv import SparseConvRule
from .rules.sparse_deconv import SparseDeconvRule
from .rules.submanifold_conv import SubmanifoldConvRule
from .rules.to_dense import ToDenseRule
from .rules.to_sparse import ToSparseRule

TARGETS = ("gpu", "nna", "hybrid")
STRATEGIES = ("auto", "unfold", "rulebook")


def _after_a_sparse_layer(tensor: gs.Tensor, ctx: LoweringContext, seen: set | None = None) -> bool:
    """Whether `tensor` is computed from the output of an already lowered sparse conv."""
    seen = set() if seen is None else seen
    if tensor.name in ctx.conv_outputs:
        return True
    if tensor.name in seen or len(tensor.inputs) != 1:
        return False
    seen.add(tensor.name)
    return any(_after_a_sparse_layer(t, ctx, seen) for t in tensor.inputs[0].inputs)


def _policy(target: str, options: Options):
    """Which compute form each conv gets. hybrid: the patent's sequence — the first sparse layer of
    every branch on the gpu path (it may read the dense input directly), the following layers on the
    nna path."""
    gpu = GpuCompute(options.strategy)
    nna = NnaCompute(options.combine, options.max_active, options.fuse_taps)
    if target == "gpu":
        return lambda node, ctx: gpu
    if target == "nna":
        return lambda node, ctx: nna
    return lambda node, ctx: nna if _after_a_sparse_layer(node.inputs[0], ctx) else gpu


def rules(target: str, options: Options) -> list:
    """The rules of `target`, in the order they are tried on a node. The boundary ops always take
    the custom ops: an accelerator cannot hash coordinates."""
    choose = _policy(target, options)
    return [ToSparseRule(), SubmanifoldConvRule(choose), SparseConvRule(choose), SparseDeconvRule(choose),
            ToDenseRule()]


__all__ = ["COMBINES", "STRATEGIES", "TARGETS", "LoweringContext", "Options", "rules"]
