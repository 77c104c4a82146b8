"""One runner per system. `prepare(built)` returns a `Prepared` (a zero-argument `run`, optionally a
`table` run timing the index tables alone) or raises `Skip` / ImportError with the reason.

Every system runs on one core (one intra-op thread), as spconv's CPU kernels must (see
`sparse_lower.exporter.spconv_calls.spconv_inference`), except `ours-gpu-auto-2threads`: the same
model on the machine's two cores, which is how a user runs it, and MinkowskiEngine, which the
performance issue runs on 2 threads (see `bench.minkowski`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort

from ..api import lower
from ..capacity import level_and_pair_rows, level_rows, most_members
from ..onnx_conventions import IR_VERSION, OPSET
from ..runtime import create_session
from .cases import Built, Skip
from ..measuring.profile import profile
from ..measuring.timing import THREADS, session_options



def index_only(lowered: onnx.ModelProto) -> onnx.ModelProto:
    """The lowered model cut down to the nodes that do not depend on the features (every floating-point
    input: a point transformer's positions too): the index tables and the int64 index arithmetic, every
    output of theirs made a graph output so none is pruned."""
    model = onnx.ModelProto()
    model.CopyFrom(lowered)
    constant = {t.name for t in model.graph.initializer}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)
    tainted = {v.name for v in model.graph.input if v.type.tensor_type.elem_type in floats}
    keep = []
    for node in model.graph.node:  # topologically sorted
        if any(i in tainted for i in node.input if i):
            tainted.update(node.output)
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    produced = {o for n in keep for o in n.output if o}
    del model.graph.output[:]
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(o) for o in sorted(produced))
    used = {i for n in keep for i in n.input}
    inputs = [v for v in model.graph.input if v.name in used and v.name not in constant]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    initializers = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(initializers)
    return model


def layer_flops(unfold_lowered: onnx.ModelProto, tables: dict) -> dict[str, dict]:
    """{layer: {"cin", "cout", "pairs", "flops"}} of the sparse convs of a gpu-unfold lowered model, by
    layer name (the first part of its nodes' names); pairs are the entries nbr ≥ 0 of the layer's
    neighbour table, Cin · K · Cout the MatMul weight's shape, flops 2 · pairs · Cin · Cout."""
    weights = {t.name: tuple(t.dims) for t in unfold_lowered.graph.initializer}
    consumers = {}
    for node in unfold_lowered.graph.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    layers = {}
    for node in unfold_lowered.graph.node:
        if node.op_type != "IndexedUnfold":
            continue
        nbr = tables.get(node.input[1])
        matmuls = [c for c in consumers.get(node.output[0], []) if c.op_type == "MatMul" and c.input[1] in weights]
        if nbr is None or not matmuls:
            continue
        rows, cout = weights[matmuls[0].input[1]]
        cin = rows // nbr.shape[-1]
        pairs = int(np.count_nonzero(nbr >= 0))
        layers[node.name.split("/")[0]] = {"cin": cin, "cout": cout, "pairs": pairs, "flops": 2.0 * pairs * cin * cout}
    return layers


def useful_flops(unfold_lowered: onnx.ModelProto, tables: dict) -> tuple[float, int]:
    """(2 · Σ pairs · Cin · Cout, Σ pairs) over the sparse convs of a gpu-unfold lowered model (layer_flops)."""
    layers = layer_flops(unfold_lowered, tables).values()
    return sum(layer["flops"] for layer in layers), sum(layer["pairs"] for layer in layers)


@dataclass
class Prepared:
    run: Callable[[], object]
    table: Callable[[], object] | None = None
    rows_out: int | None = None
    note: str = ""
    flops: float | None = None  # useful FLOPs, from the neighbour tables (gpu unfold only)
    pairs: int | None = None
    profile: Callable[[], dict] | None = None  # per op and per layer (measuring.profile), ours only


class Ours:
    """Our lowering for `target` with `options`. `fitted` (nna): static shapes fitted to the case's own
    frame, a capacity per level (capacity.level_rows) and, for the pairs combine, the pairs per tap
    (capacity.pair_rows), as a deployment measures them on its frames."""

    def __init__(self, name: str, target: str, nna_max_rows: int | None = None, threads: int = THREADS,
                 fitted: bool = False, named_only: bool = False, **options):
        self.name, self.target, self.options, self.nna_max_rows = name, target, options, nna_max_rows
        self.threads, self.fitted, self.named_only = threads, fitted, named_only

    def prepare(self, built: Built) -> Prepared:
        if built.ours is not None and self.name not in built.ours:
            raise Skip(f"this case runs {', '.join(built.ours)} of ours")
        if self.named_only and built.ours is None:
            raise Skip(f"{self.name} runs where a case names it (the point transformers' rows)")
        if self.target == "nna" and self.nna_max_rows is not None and built.rows_in > self.nna_max_rows:
            raise Skip(f"nna skipped above {self.nna_max_rows:,} input rows (has {built.rows_in:,}); "
                       "--nna-max-rows raises it")
        options = dict(self.options)
        if self.fitted and options.get("combine") == "pairs":
            options["max_active"], options["max_pairs"] = level_and_pair_rows(built.source, [built.feeds])
        elif self.fitted:
            options["max_active"] = level_rows(built.source, [built.feeds])
        if self.fitted:
            options["max_members"] = most_members(built.source, [built.feeds])
        lowered = lower(built.source, target=self.target, **options)
        session = create_session(lowered, sess_options=session_options(self.threads))
        feeds = dict(built.feeds)
        first = session.run(None, feeds)
        sparse_out = [o for o in first if o.ndim == 2 and o.dtype == np.int64]
        tables_model = index_only(lowered)
        table_inputs = {v.name for v in tables_model.graph.input}
        table_session = create_session(tables_model, sess_options=session_options(self.threads))
        table_feeds = {k: v for k, v in feeds.items() if k in table_inputs}
        flops = pairs = None
        if self.target == "gpu" and self.options.get("strategy") == "unfold":
            names = [o.name for o in table_session.get_outputs()]
            flops, pairs = useful_flops(lowered, dict(zip(names, table_session.run(None, table_feeds))))
        return Prepared(run=lambda: session.run(None, feeds), table=lambda: table_session.run(None, table_feeds),
                        rows_out=len(sparse_out[0]) if sparse_out else None, flops=flops, pairs=pairs,
                        profile=lambda: profile(lowered, feeds, session_options(self.threads)))


class Spconv:
    name = "spconv-2.3.8"

    def prepare(self, built: Built) -> Prepared:
        run = built.spconv()
        rows = run()
        return Prepared(run=run, rows_out=rows if isinstance(rows, int) else None)


class Minkowski:
    name = "minkowski-0.5.4"

    def prepare(self, built: Built) -> Prepared:
        run = built.minkowski()
        rows = run()
        return Prepared(run=run, note=f"{rows:,} rows out (its strided convs place outputs at floor(i/s)·s)")


class TorchSparse:
    name = "torchsparse-1.4.0"

    def prepare(self, built: Built) -> Prepared:
        if built.torchsparse is None:
            raise Skip("no TorchSparse version of this case (only the MinkUNet row has one)")
        run = built.torchsparse()
        return Prepared(run=run, rows_out=run())


class PointceptTorch:
    """A Pointcept row's module in PyTorch: torch on `threads` threads, spconv's layers on one."""

    def __init__(self, threads: int):
        self.threads = threads
        self.name = f"pointcept-torch-{threads}thread{'s' if threads > 1 else ''}"

    def prepare(self, built: Built) -> Prepared:
        if built.pointcept is None:
            raise Skip("no Pointcept module in this case (the point transformers' gpu rows have one)")
        run = built.pointcept(self.threads)
        return Prepared(run=run, rows_out=run())


class DenseOrt:
    name = "ort-dense"

    def prepare(self, built: Built) -> Prepared:
        if built.dense is None:
            raise Skip("networks have no dense runner (a dense CenterPoint grid 41x1440x1440 would need "
                       "GiBs per layer)")
        model, feeds = built.dense()
        session = ort.InferenceSession(model.SerializeToString(), sess_options=session_options(),
                                       providers=["CPUExecutionProvider"])
        session.run(None, feeds)
        return Prepared(run=lambda: session.run(None, feeds), note="densify not timed")


def default_systems(nna_max_rows: int | None = 50_000) -> list:
    return [Ours("ours-gpu-auto", "gpu", strategy="auto"),
            Ours("ours-gpu-auto-2threads", "gpu", threads=2, strategy="auto"),
            Ours("ours-gpu-unfold", "gpu", strategy="unfold"),
            Ours("ours-gpu-rulebook", "gpu", strategy="rulebook"),
            Ours("ours-nna-gather", "nna", nna_max_rows, combine="gather"),
            Ours("ours-nna-scatter", "nna", nna_max_rows, combine="scatter"),
            Ours("ours-nna-levels-2threads", "nna", nna_max_rows, threads=2, fitted=True, combine="gather",
                 layout="rows"),
            Ours("ours-nna-pairs-2threads", "nna", nna_max_rows, threads=2, fitted=True, combine="pairs",
                 layout="rows"),
            Ours("ours-portable-2threads", "portable", threads=2, named_only=True),
            Spconv(), Minkowski(), TorchSparse(), PointceptTorch(1), PointceptTorch(2), DenseOrt()]


def gemm_peak_gflops(size: int = 2048, repeat: int = 5, threads: int = THREADS) -> float:
    """The fp32 GEMM peak: onnxruntime MatMul size³ on `threads` threads, the best of `repeat` runs (a
    peak, and on a shared machine the median of a few runs lands anywhere below it)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["C"])], "gemm",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT, [size, size]),
                               helper.make_tensor_value_info("B", TensorProto.FLOAT, [size, size])],
                              [helper.make_tensor_value_info("C", TensorProto.FLOAT, [size, size])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    session = ort.InferenceSession(model.SerializeToString(), sess_options=session_options(threads),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {"A": rng.standard_normal((size, size), dtype=np.float32),
             "B": rng.standard_normal((size, size), dtype=np.float32)}
    return _best_gflops(lambda: session.run(None, feeds), size, repeat)


def _best_gflops(product, size: int, repeat: int) -> float:
    """GFLOP/s of `product` (a size³ GEMM) in its best of `repeat` runs after a warm-up."""
    import time

    product()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        product()
        times.append(time.perf_counter() - start)
    return 2.0 * size ** 3 / min(times) / 1e9


def numpy_gemm_peak_gflops(size: int = 2048, repeat: int = 5) -> float:
    """numpy's fp32 matmul size³ on its BLAS's default threads (every core), the best of `repeat` runs:
    the other GEMM a reader may hold our rate against (OpenBLAS is faster than onnxruntime's MatMul on
    some CPUs)."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((size, size), dtype=np.float32), rng.standard_normal((size, size), dtype=np.float32)
    return _best_gflops(lambda: a @ b, size, repeat)
