"""Lowering: one rule per source op (rules/, written as match / check / rewrite), the compute form
each target gives a conv (gpu/, nna/, portable/, behind compute.py's interface) and where its index
tables come from (index_tables.py: the library's custom ops, or portable/'s standard ops, with nna/'s
standard forms of its combines' tables for `tables="standard"`).
`compute_policy(target, options)` says which form each conv gets, `index_tables(target, graph, options)` which
tables; the pass (passes/lower.py) applies the rules with them."""

from __future__ import annotations

from collections.abc import Callable

import onnx
import onnx_graphsurgeon as gs

from .compute import Compute
from .context import LoweringContext, Options
from .gpu import GpuCompute
from .index_tables import CustomOpTables, IndexTables
from .nna import COMBINES, LAYOUTS, NnaCompute
from .nna.standard_tables import StandardNnaTables
from .portable import PortableCompute, StandardOpTables, grid_halos
from .rules import RULES, Refusal, Rule, rule_for

TARGETS = ("gpu", "nna", "hybrid", "portable")
STRATEGIES = ("auto", "unfold", "rulebook", "fused")
TABLES = ("library", "standard")  # where the nna and hybrid targets' tables come from (the `tables` option)


def _gpu_compute(strategy: str) -> GpuCompute:
    """The gpu compute form. `auto` is `fused`, the fastest on every real layer `sparse-lower bench`
    measures (why: gpu/compute.py). A conv reading a dense input gets the rulebook (see GpuCompute)."""
    return GpuCompute("fused" if strategy == "auto" else strategy)


def compute_policy(target: str, options: Options) -> Callable[[gs.Node, LoweringContext], Compute]:
    """Which compute form each conv gets: on the gpu path `options.strategy`, or the form
    `options.layer_strategies` names for the conv. hybrid: the patent's sequence — the first sparse layer of
    every branch on the gpu path (it may read the dense input directly), the following layers on the
    nna path."""
    if target == "portable":
        portable = PortableCompute()
        return lambda node, ctx: portable
    forms = {strategy: _gpu_compute(strategy) for strategy in STRATEGIES}
    chosen = options.layer_strategies or {}

    def gpu(node: gs.Node) -> GpuCompute:  # the conv's own form where one was chosen for it
        return forms[chosen.get(node.name, options.strategy)]

    nna = NnaCompute(options.combine, options.max_active, options.fuse_taps, options.layout, options.max_pairs,
                     options.max_members)
    if target == "gpu":
        return lambda node, ctx: gpu(node)
    if target == "nna":
        return lambda node, ctx: nna
    return lambda node, ctx: nna if ctx.after_a_sparse_layer(node.inputs[0]) else gpu(node)


def index_tables(target: str, graph: onnx.GraphProto, options: Options) -> IndexTables:
    """Where the target's index tables come from: standard ops for portable, and for nna and hybrid with
    `tables="standard"`, the custom ops otherwise. With `max_active`, the portable tables have static
    shapes, their grids sized for `max_batch` batches; the nna ones follow the frame's rows, which its
    compute pads to the capacity (nna/padding.py)."""
    if target == "portable":
        return StandardOpTables(grid_halos(graph), options.max_active, options.max_batch or 1)
    if options.tables == "standard":
        return StandardNnaTables(grid_halos(graph))
    return CustomOpTables()


def default_batches(graph: onnx.GraphProto) -> int:
    """The batches the portable static form holds unless told: the model's ToDense batch_size, else 1."""
    return max((a.i for n in graph.node if n.op_type == "ToDense" for a in n.attribute
                if a.name == "batch_size" and a.type == onnx.AttributeProto.INT and a.i >= 1), default=1)


__all__ = ["COMBINES", "LAYOUTS", "RULES", "STRATEGIES", "TABLES", "TARGETS", "LoweringContext", "Options", "Refusal",
           "Rule", "compute_policy", "default_batches", "index_tables", "rule_for"]
