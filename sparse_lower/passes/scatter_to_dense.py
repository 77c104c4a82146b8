"""ScatterToDense: a sparse tensor's rows scattered into zeros by a standard `ScatterND` (spconv's
`.dense()` as torch.onnx exports it, which Autoware's files keep) become the source op `ToDense`.

Why: `ScatterND(zeros [B, *S, C], coords, rows)` is what `ToDense` means, spelled in standard ops that
no lowering sees through. Each target lowers `ToDense` in its own way: the gpu target's `IndexedFold`
writes the dense output straight from the rows; the portable static form leaves out the padding rows
(coords −1), which a `ScatterND` would take for sites.

How it is recognised, all of it or nothing (a near miss stays the ScatterND it was):
* the `ScatterND` has no reduction, and its data is zeros of a constant shape `[B, *S, C]`
  (a `ConstantOfShape` of a constant shape, a `Constant` or an initializer);
* walking back from its indices and updates, the only run-time tensors reached are one coords tensor
  of a source op and one tensor of rows on those coords (a source op's output rows, or those after
  row-wise ops such as Relu or a residual Add);
* what lies between is run on a probe (onnx's reference evaluator; distinct numbers in the coords and
  the rows) and gives the coords back as the indices and the rows back as the updates. torch.onnx
  spells `.dense()` as a column-by-column Gather, Expand, Unsqueeze and Concat of the coords and a
  Reshape of the rows computed from their shapes; Autoware's pair ops add Casts to int32 and back.
  The probe reads every spelling alike.

A traced `.dense()` is followed by the Transpose to channels first ([B, C, *S], what `ToDense` gives);
where it is the ScatterND's only reader, it goes too, else a Transpose back to [B, *S, C] takes the
ScatterND's place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from ..errors import SparseLowerError
from ..lowering.graph import deep_graph, model_like
from ..lowering.nna.padding import ROWWISE
from ..onnx_conventions import SOURCE_DOMAIN, is_standard
from ..schemas import CONV_OPS, conv_channels

_PROBE_ROWS = 5


@dataclass(frozen=True)
class Densify:
    """A ScatterND (by its output) that is `ToDense(rows, coords)` with the zeros' shape [B, *S, C]."""

    output: str
    rows: str
    coords: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Rows:
    """A tensor of sparse rows: the coords tensors they lie on, and their width."""

    coords: frozenset[str]
    channels: int


def _sparse_tensors(graph: onnx.GraphProto) -> tuple[dict[str, Rows], dict[str, int]]:
    """(every tensor of sparse rows, every coords tensor of a source conv with its D). Rows start at a
    conv's output features (a submanifold conv's lie on its input coords too) and follow row-wise ops
    whose other operands are rows of the same width or constants."""
    constants = {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    weights = {t.name: list(t.dims) for t in graph.initializer}
    rows: dict[str, Rows] = {}
    coords: dict[str, int] = {}
    for node in graph.node:
        if node.domain == SOURCE_DOMAIN and node.op_type in CONV_OPS:
            on = {node.output[1]} | ({node.input[1]} if node.op_type == "SubmanifoldConv" else set())
            ndim = len(next(a.ints for a in node.attribute if a.name == "spatial_shape"))
            coords.update({c: ndim for c in on})
            if node.input[2] in weights:
                rows[node.output[0]] = Rows(frozenset(on), conv_channels(node.op_type, weights[node.input[2]])[1])
        elif is_standard(node.domain) and node.op_type in ROWWISE and len(node.output) == 1:
            operands = [rows.get(name) for name in node.input if name not in constants]
            if operands and all(operands) and len({r.channels for r in operands}) == 1:
                rows[node.output[0]] = Rows(frozenset.intersection(*(r.coords for r in operands)), operands[0].channels)
    return rows, coords


def _zeros(graph: onnx.GraphProto, name: str, producer: dict[str, onnx.NodeProto]
           ) -> tuple[tuple[int, ...] | None, str | None] | None:
    """(its shape, or the tensor its shape is computed from) where `name` is float32 zeros: a constant,
    or a `ConstantOfShape` of zeros (whose shape torch.onnx computes from the rows' width); else None."""
    fill = producer.get(name)
    if fill is not None and fill.op_type == "ConstantOfShape" and is_standard(fill.domain):
        given = [numpy_helper.to_array(a.t) for a in fill.attribute if a.name == "value"]
        if given and (given[0].dtype != np.float32 or np.any(given[0])):
            return None
        shape = _constant(graph, fill.input[0], producer)
        return (None, fill.input[0]) if shape is None else (tuple(int(v) for v in shape.reshape(-1)), None)
    value = _constant(graph, name, producer)
    if value is None or value.dtype != np.float32 or np.any(value):
        return None
    return value.shape, None


def _constant(graph: onnx.GraphProto, name: str, producer: dict[str, onnx.NodeProto]) -> np.ndarray | None:
    """The value of an initializer or of a Constant node's `value`, else None."""
    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    node = producer.get(name)
    if node is not None and node.op_type == "Constant":
        given = [numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"]
        return given[0] if given else None
    return None


def _between(graph: onnx.GraphProto, names: list[str], stops: set[str], producer: dict[str, onnx.NodeProto]
             ) -> tuple[list[onnx.NodeProto], set[str]] | None:
    """(the nodes computing `names` from the `stops`, in graph order; the stops they read), or None
    where they read a run-time tensor that is no stop (a graph input, a source op's other output)."""
    initializers = {t.name for t in graph.initializer}
    needed, reached, wanted = set(), set(), list(names)
    while wanted:
        name = wanted.pop()
        if name in stops:
            reached.add(name)
            continue
        if name in initializers or not name:
            continue
        node = producer.get(name)
        if node is None or not is_standard(node.domain):
            return None
        if id(node) not in needed:
            needed.add(id(node))
            wanted.extend(node.input)
    return [n for n in graph.node if id(n) in needed], reached


def _probed(opsets, initializers: list[onnx.TensorProto], nodes: list[onnx.NodeProto], rows: str, coords: str,
            outputs: list[str], channels: int, ndim: int, coords_type: int) -> list[tuple[int, ...]] | None:
    """Where `nodes` give back the probe's coords and rows as the first two `outputs` (indices,
    updates), for probes of two sizes: the values of the other outputs (the zeros' computed shape),
    as tuples, for each probe. Else None."""
    found = []
    for count in (_PROBE_ROWS, _PROBE_ROWS + 2):
        coords_probe = (1 + np.arange(count * (1 + ndim))).reshape(count, 1 + ndim)
        coords_probe = coords_probe.astype(onnx.helper.tensor_dtype_to_np_dtype(coords_type))
        rows_probe = (1 + np.arange(count * channels, dtype=np.float32)).reshape(count, channels)
        feeds = {coords: coords_probe, rows: rows_probe}
        used = [t for t in initializers if any(t.name in n.input for n in nodes)]
        sub = onnx.helper.make_graph(
            nodes, "probe", [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in feeds],
            [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in outputs], used)
        try:
            indices, updates, *others = ReferenceEvaluator(onnx.helper.make_model(sub, opset_imports=opsets)).run(
                None, feeds)
        except Exception:  # anything the evaluator cannot run is no `.dense()` this pass can vouch for
            return None
        if not (np.shape(indices) == coords_probe.shape and np.array_equal(indices, coords_probe)
                and np.shape(updates) == rows_probe.shape and np.array_equal(updates, rows_probe)):
            return None
        found.append([tuple(int(v) for v in np.reshape(value, -1)) for value in others])
    return found


def densifying_scatters(model: onnx.ModelProto) -> list[Densify]:
    """Every ScatterND of `model` that is a `.dense()` of a sparse tensor (module docstring)."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    types.update({n.output[1]: onnx.TensorProto.INT64 for n in graph.node if n.domain == SOURCE_DOMAIN
                  and n.op_type in CONV_OPS})
    rows, coords = _sparse_tensors(graph)
    found = []
    for node in graph.node:
        if node.op_type != "ScatterND" or not is_standard(node.domain) or len(node.input) != 3 or any(
                a.name == "reduction" and a.s not in (b"", b"none") for a in node.attribute):
            continue
        zeros = _zeros(graph, node.input[0], producer)
        if zeros is None:
            continue
        given, computed = zeros
        between = _between(graph, [*node.input[1:], *filter(None, [computed])], set(rows) | set(coords), producer)
        if between is None:
            continue
        nodes, reached = between
        on = [c for c in reached if c in coords]
        cut = [r for r in reached if r in rows and r not in coords]
        if len(on) != 1 or len(cut) != 1 or on[0] not in rows[cut[0]].coords or types.get(on[0]) not in (
                onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            continue
        ndim, channels = coords[on[0]], rows[cut[0]].channels
        probes = _probed(model.opset_import, list(graph.initializer), nodes, cut[0], on[0],
                         [*node.input[1:], *filter(None, [computed])], channels, ndim, types[on[0]])
        if probes is None or (computed and probes[0] != probes[1]):  # a shape that follows the rows: no grid
            continue
        shape = probes[0][0] if computed else given
        if len(shape) == ndim + 2 and shape[-1] == channels and min(shape) >= 1:
            found.append(Densify(node.output[0], cut[0], on[0], shape))
    return found


def _channels_first(graph: gs.Graph, tensor: gs.Tensor, ndim: int) -> gs.Node | None:
    """The one reader of `tensor` when it is the Transpose of [B, *S, C] to [B, C, *S]."""
    if len(tensor.outputs) != 1 or tensor in graph.outputs:
        return None
    reader = tensor.outputs[0]
    perm = list(reader.attrs.get("perm", [])) if reader.op == "Transpose" and is_standard(reader.domain) else []
    return reader if perm == [0, ndim + 1, *range(1, ndim + 1)] else None


def rewrite(graph: gs.Graph, found: Densify) -> None:
    """Replace the ScatterND of `found` by ToDense (and the Transpose to channels first, where it follows)."""
    tensors = graph.tensors()
    out, rows, coords = tensors[found.output], tensors[found.rows], tensors[found.coords]
    scatter = out.inputs[0]
    scatter.outputs = []
    batch, *spatial, _ = found.shape
    name = scatter.name or found.output
    attrs = {"spatial_shape": spatial, "batch_size": batch}
    transpose = _channels_first(graph, out, len(spatial))
    if transpose is not None:
        dense = transpose.outputs[0]
        transpose.outputs = []
    else:
        dense = gs.Variable(f"{found.output}/channels_first", dtype=np.float32)
        graph.nodes.append(gs.Node("Transpose", f"{name}/channels_last",
                                   {"perm": [0, *range(2, len(spatial) + 2), 1]}, [dense], [out]))
    graph.nodes.append(gs.Node("ToDense", f"{name}/to_dense", attrs, [rows, coords], [dense], domain=SOURCE_DOMAIN))


class ScatterToDense:
    """requires: a validated source model (ValidateSourceOps). ensures: no ScatterND is left that is a
    `.dense()` of a sparse tensor's rows (module docstring); every other node is as it was."""

    name = "scatter-to-dense"
    step = "reading each ScatterND of a sparse tensor's rows into zeros as ToDense"

    def requires(self, model: onnx.ModelProto) -> None:
        """Any validated model: the pass only looks for the pattern."""

    def call(self, model: onnx.ModelProto) -> onnx.ModelProto:
        found = densifying_scatters(model)
        if not found:
            return model
        graph = gs.import_onnx(model)
        for each in found:
            rewrite(graph, each)
        with deep_graph(graph):
            graph.cleanup().toposort()
        return model_like(graph, model)

    def ensures(self, model: onnx.ModelProto) -> None:
        left = densifying_scatters(model)
        if left:
            raise SparseLowerError(f"{len(left)} ScatterND nodes still densify a sparse tensor's rows", left[0].output)
