"""Lowering: one rule per source op (rules/, written as match / check / rewrite), and the compute form
each target gives a conv (gpu/, nna/, both behind compute.py's interface). `compute_policy(target,
options)` says which form each conv gets; the pass (passes/lower.py) applies the rules with it."""

from __future__ import annotations

from collections.abc import Callable

import onnx_graphsurgeon as gs

from .compute import Compute
from .context import LoweringContext, Options
from .gpu import GpuCompute
from .nna import COMBINES, LAYOUTS, NnaCompute
from .rules import RULES, Refusal, Rule, rule_for

TARGETS = ("gpu", "nna", "hybrid")
STRATEGIES = ("auto", "unfold", "rulebook", "fused")


def _gpu_compute(strategy: str) -> GpuCompute:
    """The gpu compute form. `auto` is `fused`, the fastest on every real layer `sparse-lower bench`
    measures (why: gpu/compute.py). A conv reading a dense input gets the rulebook (see GpuCompute)."""
    return GpuCompute("fused" if strategy == "auto" else strategy)


def compute_policy(target: str, options: Options) -> Callable[[gs.Node, LoweringContext], Compute]:
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


__all__ = ["COMBINES", "LAYOUTS", "RULES", "STRATEGIES", "TARGETS", "LoweringContext", "Options", "Refusal", "Rule",
           "compute_policy", "rule_for"]
