"""The public compiler entry points: `lower` (docs/python_api.md), and `partition`, the graph partitioner
with the lowering's cost table in its summary (docs/partitioning.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import partial

import numpy as np
import onnx

from .errors import SparseLowerError
from .importers import SOURCE_FORMAT, detect_format, format_title, nothing_to_lower
from .layer_costs import method_report
from .model_io import load, recorded_options
from .onnx_conventions import SOURCE_DOMAIN
from .lowering import COMBINES, LAYOUTS, STRATEGIES, TABLES, TARGETS, Options
from .partition import DEFAULT_DEVICES, Partition, Predicate
from .partition import partition as partition_graph
from .passes.bf16_convs import PRECISIONS, Bf16Convs
from .passes.check import CheckModel, check_model
from .passes.float16 import WidenFloat16
from .passes.fuse_epilogues import FuseEpilogues
from .passes.lower import LowerSparse
from .passes.manager import PassManager
from .passes.scatter_to_dense import ScatterToDense
from .passes.site_order import SortFirstSites
from .passes.validate import ValidateSourceOps
from .schemas import CONV_OPS, conv_geometry


# The options each target reads, with their defaults: another target given one of them is refused (by
# `lower` and by `sparse-lower convert`), since a user who gives an option expects it to count.
TARGET_OPTIONS = {"strategy": ({"gpu", "hybrid"}, "auto"), "combine": ({"nna", "hybrid"}, "gather"),
                  "layout": ({"nna", "hybrid"}, "image"), "fuse_taps": ({"nna", "hybrid"}, False),
                  "max_active": ({"nna", "hybrid", "portable"}, None), "max_pairs": ({"nna", "hybrid"}, None),
                  "max_members": ({"nna", "hybrid"}, None), "tables": ({"nna", "hybrid"}, "library"),
                  "precision": ({"gpu"}, "float32")}


def unread_option(target: str, given: Mapping[str, object]) -> tuple[str, set[str]] | None:
    """The first of the options `given` (by name, with their values; None or False: not given) that
    `target` does not read, and the targets that read it; None where each is read."""
    for option, (targets, _) in TARGET_OPTIONS.items():
        if given.get(option) not in (None, False) and target not in targets:
            return option, targets
    return None


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise SparseLowerError(f"unknown {name} '{value}'", fix=f"use one of {', '.join(allowed)}")


def positive_int(value) -> bool:
    """Whether `value` is an int >= 1 (not a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1


MAX_CAPACITY = 2**31 - 1  # rows the static forms index: the toolchains take int32 indices


def _capacities(max_active) -> int | tuple[int, ...] | None:
    """`max_active` checked: None, one capacity, or a non-empty sequence of them (one per level), as a tuple;
    each at most MAX_CAPACITY."""
    if max_active is None:
        return None
    values = [max_active] if positive_int(max_active) else list(max_active) if isinstance(max_active, (list, tuple)) \
        else []
    if not values or not all(map(positive_int, values)):
        raise SparseLowerError(f"max_active={max_active!r} is neither a positive int nor a sequence of them",
                               fix="give None, an int >= 1, or one int >= 1 per level, e.g. "
                                   "[80000, 60000, 30000, 15000]")
    if max(values) > MAX_CAPACITY:
        raise SparseLowerError(f"max_active={max_active!r}: a capacity over {MAX_CAPACITY:,} rows, which the static "
                               "forms cannot index (int32 indices), and no memory holds",
                               fix="give the most rows a frame has at each level: `sparse-lower inspect MODEL "
                                   "--frames ...` measures them")
    return int(max_active) if positive_int(max_active) else tuple(int(v) for v in values)


def _pair_capacities(max_pairs, model: onnx.ModelProto, target: str, combine: str,
                     max_active) -> dict[str, tuple[int, ...]] | None:
    """`max_pairs` checked against the model: per named sparse conv, one count >= 0 per kernel tap."""
    if max_pairs is None:
        return None
    if target not in ("nna", "hybrid") or combine != "pairs" or max_active is None:
        raise SparseLowerError("max_pairs sizes the pairs combine's per-tap lists under a fixed capacity",
                               fix="give it with target 'nna' or 'hybrid', combine='pairs' and max_active, or "
                                   "leave it out")
    if not isinstance(max_pairs, Mapping):
        raise SparseLowerError(f"max_pairs is a {type(max_pairs).__name__}, not a mapping",
                               fix="give {conv name: [pairs per tap]}, as sparse_lower.capacity.pair_rows returns")
    taps = {n.name: conv_geometry(n).volume for n in model.graph.node if n.domain == SOURCE_DOMAIN and n.op_type in CONV_OPS}
    checked = {}
    for name, counts in max_pairs.items():
        if name not in taps:
            raise SparseLowerError(f"max_pairs names '{name}', which is not a sparse conv of the model", name,
                                   f"use the names of its sparse convs (e.g. {', '.join(list(taps)[:3]) or 'none'})")
        if (not isinstance(counts, Sequence) or len(counts) != taps[name]
                or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 0 for n in counts)):
            raise SparseLowerError(f"max_pairs['{name}'] = {counts!r} is not {taps[name]} counts >= 0, one per kernel tap",
                                   name, "give one int >= 0 per tap, in the kernel's row-major order")
        checked[name] = tuple(int(n) for n in counts)
    return checked


def lower(model: onnx.ModelProto | str | os.PathLike, target: str = "gpu", *, strategy: str = "auto",
          combine: str = "gather", max_active: int | Sequence[int] | None = None, max_batch: int | None = None,
          fuse_taps: bool = False, layout: str = "image", max_pairs: Mapping[str, Sequence[int]] | None = None,
          max_members: int | None = None, tables: str = "library", precision: str = "float32",
          layer_strategies: Mapping[str, str] | None = None, dump_dir: str | os.PathLike | None = None,
          check_each_pass: bool = False) -> onnx.ModelProto:
    """Rewrite the sparse-convolution nodes of `model` for `target`; run the result with
    `create_session`.

    * target "gpu": index-builder custom ops → IndexedUnfold → MatMul (→ IndexedFold); `strategy`
      picks the compute form ("unfold", "rulebook", "fused": the three in one `IndexedConv`;
      "auto": fused, which won every benchmark case, with the rulebook for a conv reading a dense
      input). A `Relu` or residual `Add` (+ `Relu`) right after an `IndexedConv` becomes part of it.
    * target "nna": the index tables from the custom ops, the compute in standard ops only: one 1×1
      Conv per kernel tap on `[1, C, 1, N]` (`fuse_taps`: one Conv with K·Cout outputs) and a
      `combine` method ("gather", "scatter", "matmul"; "pairs" multiplies only the rows each tap pairs;
      "unfold" gathers each output's K input rows side by side and multiplies them once, one rounding
      per output for accelerators that quantize every tensor; docs/lowered_forms.md). `max_active` fixes the row capacity so that
      the compute part has static shapes; more active rows than that is a run-time error. A sequence
      gives one capacity per level (the model's input sites are level 0, each SparseConv's outputs the
      next; a SparseDeconv returns to its targets' level, or one up), the last one for deeper levels:
      the deep layers of a backbone hold far fewer sites than its input, and their shapes shrink too. `layout`
      "rows" computes on `[N, C]` rows with one MatMul per tap instead (for converters that re-lay
      4-D tensors out, such as onnx2tf; docs/toolchains.md). With "pairs" and `max_active`, `max_pairs`
      gives each sparse conv (by node name) its pairs per tap, as `capacity.pair_rows` measures them on
      frames (a conv it leaves out holds all its rows per tap; more pairs is a run-time error). NaN/Inf
      features propagate as in a dense conv, except with "matmul": its 0/1 scatter matrices turn one
      non-finite value into NaN in every output of the layer (0·NaN = NaN). A Coalesce under
      `max_active` also needs `max_members`, the most rows one of its sites may merge (more is a run-time
      error; `capacity.level_rows` measures the row counts, `capacity.most_members` this one).
    * target "hybrid": the first sparse layer of each branch on the gpu path, the rest on the nna path.
    * `tables` (nna and hybrid): "library" (the custom ops build the index tables, and refuse a broken
      frame or one over a capacity, naming the row), or "standard": the portable target's tables and
      standard forms of the nna combines' tables, so that the host part runs in any ONNX runtime
      without the library (an nna model then holds standard ops only; a hybrid model's first layers keep
      their custom ops). Same tables, same outputs; a frame the library would refuse gives NaN features,
      and the matmul combine needs `max_active` (docs/lowered_forms.md).
    * target "portable": standard ONNX ops only, no library: the index tables are built inside the graph
      from a two-level site grid per coords tensor, sized by the frame's own rows (a frame whose grid would
      take more than `lowering.portable.MAX_GRID_BYTES` gets NaN), each conv is Gather → MatMul → Add. Any
      ONNX runtime runs it (docs/portable.md). A frame that breaks the rules of sparse tensors gives NaN
      features. With
      `max_active` (one, or one per level, as for nna) every shape is static: the inputs take exactly
      that many rows, padding rows having coords −1 (`runtime.pad_rows` pads a frame,
      `runtime.drop_padding` drops them from the outputs), and the grids span the op's whole grid and hold
      `max_batch` batches (default: the model's ToDense batch_size, else 1), refused where one batch of one
      could take more than MAX_GRID_BYTES.

    * `layer_strategies` (gpu and hybrid targets): {source conv name: strategy}, a compute form per conv
      overriding `strategy` for those convs, as `sparse_lower.tune` measures them.
    * `precision` (gpu target, fused convs): "float32", or "bf16": each `IndexedConv` rounds its input
      rows and weights to bfloat16 and sums their products in float32 (AMX tiles where the CPU has them,
      tensor cores in CUDA), within 1e-2 of float32 (docs/custom_ops.md).

    `dump_dir` receives the model after every pass; `check_each_pass` runs the ONNX checker and shape
    inference after every pass (the tests do).
    """
    _choice("target", target, TARGETS)
    _choice("strategy", strategy, STRATEGIES)
    _choice("combine method", combine, COMBINES)
    _choice("nna layout", layout, LAYOUTS)
    _choice("tables", tables, TABLES)
    _choice("precision", precision, PRECISIONS)
    if precision != "float32" and (target != "gpu" or strategy not in ("auto", "fused")):
        raise SparseLowerError(f"precision='{precision}' is the gpu target's fused convs' (IndexedConv), not "
                               f"target '{target}' with strategy '{strategy}'",
                               fix="use target 'gpu' with strategy 'auto' or 'fused', or leave precision out")
    if tables != "library" and target not in ("nna", "hybrid"):
        why = "the portable target's tables are standard ops already" if target == "portable" else \
            "the gpu target computes with the library's custom ops, which need it loaded anyway"
        raise SparseLowerError(f"tables='{tables}' writes the nna and hybrid targets' tables in standard ops; {why}",
                               fix="leave tables out, or use it with target 'nna' or 'hybrid'")
    max_active = _capacities(max_active)
    given = {option: value for option, value in (("strategy", strategy), ("combine", combine), ("layout", layout),
                                                 ("fuse_taps", fuse_taps), ("max_active", max_active),
                                                 ("max_pairs", max_pairs), ("max_members", max_members))
             if value != TARGET_OPTIONS[option][1]}  # a default is no choice of the caller's
    unread = unread_option(target, given)
    if unread:
        option, targets = unread
        raise SparseLowerError(f"{option}={given[option]!r} does nothing for target '{target}'",
                               fix=f"leave {option} out, or use it with target "
                                   f"{' or '.join(map(repr, sorted(targets)))}")
    if combine in ("pairs", "unfold") and fuse_taps:
        why = {"pairs": "the pairs combine multiplies each tap's own rows",
               "unfold": "the unfold combine has one product for all taps already"}[combine]
        raise SparseLowerError(f"fuse_taps multiplies every row by all taps in one product, and {why}",
                               fix=f"leave fuse_taps (--fuse-taps) off with the {combine} combine")
    if max_batch is not None and (target != "portable" or max_active is None or not positive_int(max_batch)):
        raise SparseLowerError(f"max_batch={max_batch!r} sizes the portable target's static form",
                               fix="give an int >= 1 together with target='portable' and max_active, or leave it out")
    model = load(model)
    max_pairs = _pair_capacities(max_pairs, model, target, combine, max_active)
    max_batch = None if max_batch is None else int(max_batch)  # None: the lowering reads the ToDense batch_size
    if max_members is not None and not positive_int(max_members):
        raise SparseLowerError(f"max_members={max_members!r} is the most rows one site of a Coalesce merges",
                               fix="give an int >= 1, or leave it out")
    layer_strategies = _layer_strategies(layer_strategies, model, target)
    options = Options(strategy=strategy, combine=combine, max_active=max_active, max_batch=max_batch,
                      fuse_taps=bool(fuse_taps), layout=layout, max_pairs=max_pairs,
                      max_members=None if max_members is None else int(max_members), tables=tables,
                      layer_strategies=layer_strategies)
    found = detect_format(model)
    if found != SOURCE_FORMAT:
        raise SparseLowerError(f"the model is an export in the {format_title(found)} format",
                               fix="import it first: sparse_lower.lower(sparse_lower.import_model(model), ...) "
                                   "(sparse-lower convert imports by itself)")
    passes = [ValidateSourceOps(), WidenFloat16(), ScatterToDense(), LowerSparse(target, options), FuseEpilogues(),
              SortFirstSites(), *([Bf16Convs()] if precision == "bf16" else []),
              CheckModel()]
    manager = PassManager(passes, verify=check_model if check_each_pass else None, dump_dir=dump_dir)
    lowered = manager.run(model)
    # Checked after the passes, so that a malformed model gets validation's more precise message.
    reason = nothing_to_lower(model)
    if reason:
        raise SparseLowerError(reason, fix="export the sparse layers in one of the recognised forms, or run a "
                                           "dense model with onnxruntime as it is")
    return lowered


def _layer_strategies(chosen: Mapping[str, str] | None, model: onnx.ModelProto, target: str) -> dict[str, str] | None:
    """`layer_strategies` checked: each a strategy, for a sparse conv of `model`, on a target with a gpu path."""
    if not chosen:
        return None
    if target not in ("gpu", "hybrid"):
        raise SparseLowerError(f"layer_strategies choose the gpu compute form, and target '{target}' has none",
                               fix="use them with target 'gpu' or 'hybrid', or leave them out")
    convs = {n.name for n in model.graph.node if n.domain == SOURCE_DOMAIN and n.op_type in CONV_OPS}
    for name, strategy in chosen.items():
        if name not in convs:
            raise SparseLowerError(f"layer_strategies names '{name}', which is not a sparse conv of the model",
                                   fix=f"name one of {', '.join(sorted(convs)) or 'its sparse convs'}")
        _choice(f"strategy of '{name}'", strategy, STRATEGIES)
    return dict(chosen)


def partition(model: onnx.ModelProto | str | os.PathLike, devices: Sequence[str] = DEFAULT_DEVICES,
              support: Mapping[str, Predicate] | None = None, static_shapes: bool = True) -> Partition:
    """The partitioner of sparse_lower/partition/ (devices, support, static_shapes: docs/partitioning.md),
    whose summary then also gives each sparse layer's MACs per lowering method (layer_costs.method_report) at
    `summary(active)` sites, by default the model's assumed ones (assumed_active.py).

    A model lowered for the portable target is one segment on the default devices: it is made to run
    whole on one runtime (its "gpu" is any device that runs standard ONNX)."""
    model = load(model)
    unlowered = [n for n in model.graph.node if n.domain == SOURCE_DOMAIN]
    if unlowered:
        raise SparseLowerError(f"the model holds {len(unlowered)} source op{'s' if len(unlowered) > 1 else ''} (e.g. "
                               f"'{unlowered[0].name}', {unlowered[0].op_type}): a partition splits a lowered model",
                               fix="lower it first: `sparse-lower convert MODEL -o MODEL.nna.onnx --target nna "
                                   "--max-active N`, or sparse_lower.lower(model, target='nna', max_active=N)")
    if tuple(devices) == DEFAULT_DEVICES and support is None and recorded_options(model).get("target") == "portable":
        devices = ("gpu",)
    return partition_graph(model, devices, support, static_shapes, layer_table=partial(method_report, model))
