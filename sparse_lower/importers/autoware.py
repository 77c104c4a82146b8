"""Autoware / TIER IV (tier4/AWML `projects/SparseConvolution`, tier4/autoware-ml `ops/spconv`), read by
Autoware's TensorRT plugins (`autoware_tensorrt_plugins`): torch.onnx at opset 17, domain `autoware`.

Unlike NVIDIA's and AIMET's, this format puts the kernel map in the graph, as its own op:

* `GetIndicePairsImplicitGemm(indices int32 [N, 4]) -> (out_indices [M, 4], pair_fwd [KV, M],
  pair_mask [M, 1], mask_argsort [M], num_act_out)`, attributes batch_size, spatial_shape (the conv's
  input grid), algo, ksize, stride, padding, dilation, out_padding, subm, transpose, is_train (and
  `do_sort` in a fork's newer files), feeding `ImplicitGemm(features [N, Cin], filters [Cout, k0, k1,
  k2, Cin], pair_fwd, pair_mask, mask_argsort[, bias]) -> [M, Cout]`, attributes is_subm, is_train,
  fp32_accum, act_alpha, act_beta, output_scale, output_add_scale (and `act_type`, 0 none, 1 ReLU,
  2 Sigmoid, 3 LeakyReLU, where a fork's post-export pass folded a following Add/Relu in);
* the native pair: `GetIndicePairs(indices) -> (out_indices, indice_pairs, indice_pair_num,
  num_act_out)` + `IndiceConv(features, filters, indice_pairs, indice_pair_num, num_act_out)`;
* submanifold convs that share an indice key read the same pair outputs; `out_indices` (output 0) is
  what later layers, and the standard ops that densify the result (ScatterND or ScatterElements), see
  as the coordinates: for a submanifold conv the input rows themselves, for a strided one the output
  sites in an order the writer leaves to the engine;
* the coordinates are `[batch, c0, c1, c2]` in the axis order of `spatial_shape`, `ksize` and the
  weight's tap axes; standard ops inside the graph build them from the `coors` input (AWML flips
  (z, y, x) to (x, y, z), autoware-ml gathers (y, x, z)), and they are int32.

The import keeps every standard op as it is and replaces each conv by a source-op conv on
(features, int64 coords of its pair node's input); its pair node's `out_indices` become the conv's
output coords as int32 (a strided conv's sorted lexicographically, which the format allows), and
`num_act_out` their row count. The pair data (pair_fwd, pair_mask, mask_argsort, indice_pairs) is
internal to the engines and is not reproduced: a standard op reading it is refused. The plugins ignore
is_train, algo, do_sort, fp32_accum, output_scale and output_add_scale, and so does the import.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np
import onnx
from onnx import TensorProto, helper

from ..errors import SparseLowerError
from ..names import node_label
from .context import Translation
from .probe import coordinate_columns
from .spconv_layers import (SpconvLayer, attribute_values, checked_bias, flag, per_dim,
                            relaid_weight, source_node)
from .standard_ops import check_schema
from .translate import source_opset, to_target_versions

DOMAIN = "autoware"
PAIR_OPS = ("GetIndicePairsImplicitGemm", "GetIndicePairs")
CONV_OPS = ("ImplicitGemm", "IndiceConv")
_PAIR_ATTRIBUTES = ("batch_size", "spatial_shape", "algo", "ksize", "stride", "padding", "dilation", "out_padding",
                    "subm", "transpose", "is_train", "do_sort")
_CONV_ATTRIBUTES = ("is_subm", "is_train", "fp32_accum", "act_alpha", "act_beta", "output_scale",
                    "output_add_scale", "act_type")
_ACTIVATIONS = {0: None, 1: "Relu", 2: "Sigmoid", 3: "LeakyRelu"}  # cumm's tv::gemm::Activation
_OUT_INDICES, _NUM_ACT_OUT = 0, -1  # the pair outputs a standard op may read: coordinates and their count


@dataclass(frozen=True)
class PairNode:
    """A kernel-map node: the conv geometry it was built for and the coordinates it was built on."""

    node: onnx.NodeProto
    where: str
    indices: str
    kind: str  # "subm", "conv" or "deconv"
    grid: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    output_padding: tuple[int, ...]
    batch_size: int | None  # the batches the traced `.dense()` holds, where the file says

    def readable(self) -> dict[str, str]:
        """The outputs a standard op may read, by name: out_indices and num_act_out."""
        return {self.node.output[0]: "out_indices", self.node.output[-1]: "num_act_out"}


class AutowareFormat:
    key = "autoware"
    title = "Autoware / TIER IV (autoware domain)"
    engine = "autoware_tensorrt_plugins"
    signature = "autoware::GetIndicePairsImplicitGemm + ImplicitGemm, or GetIndicePairs + IndiceConv"

    def is_conv(self, node: onnx.NodeProto) -> bool:
        return node.domain == DOMAIN and node.op_type in CONV_OPS

    def translate(self, model: onnx.ModelProto, widened: list[str], leaky_relu_alpha: float | None) -> onnx.ModelProto:
        t = Translation(model, self.key, self.title, widened, leaky_relu_alpha)
        pairs, convs = _parse(model)
        opset = source_opset(model)
        done: dict[str, str] = {}  # pair node output name -> emitted
        grids: dict[str, tuple[int, ...]] = {}  # a pair op's out_indices -> the grid of those coordinates
        for index in _order(model, pairs, convs):
            node, where = model.graph.node[index], node_label(model.graph.node[index], index)
            if index in convs:
                pair = pairs[convs[index]]
                _check_grid(pair, grids)
                grids[pair.node.output[0]] = _conv(t, node, where, pair, done)
                continue
            t.require_available(node, where)
            check_schema(node, where, opset)
            copy = helper.make_node(node.op_type, list(node.input), list(node.output), name=t.node_name(where))
            copy.attribute.extend(node.attribute)
            t.append(copy)
        _describe_coordinates(t, model, pairs)
        imported = to_target_versions(t.finish((DOMAIN,), opset))
        t.check_standard_ops(imported)
        return imported


def _ints(where: str, values: dict, name: str, ndim: int, default=None) -> tuple[int, ...]:
    if name not in values:
        if default is None:
            raise SparseLowerError(f"attribute '{name}' missing", where, f"write {name}, {ndim} ints")
        return (default,) * ndim
    return per_dim(where, name, values[name], ndim)


def _pair(node: onnx.NodeProto, where: str) -> PairNode:
    """A pair op's geometry, as the plugin reads it (out_padding counts only for a transposed conv)."""
    expected = 5 if node.op_type == "GetIndicePairsImplicitGemm" else 4
    if len(node.input) != 1 or len(node.output) != expected:
        raise SparseLowerError(f"{node.op_type} takes (indices) and has {expected} outputs, got {len(node.input)} "
                               f"inputs and {len(node.output)} outputs", where, "export the node as the writer does")
    values = attribute_values(node, where)
    unknown = sorted(set(values) - set(_PAIR_ATTRIBUTES))
    if unknown:
        raise SparseLowerError(f"{node.op_type} has no attribute {', '.join(unknown)}", where,
                               f"remove it; it takes {', '.join(_PAIR_ATTRIBUTES)}")
    grid = values.get("spatial_shape")
    if not isinstance(grid, list) or not 1 <= len(grid) <= 3 or not all(isinstance(v, int) and v >= 1 for v in grid):
        raise SparseLowerError(f"attribute 'spatial_shape'={grid!r} is not a grid", where,
                               "write the conv's input grid as 1 to 3 extents >= 1")
    ndim = len(grid)
    subm, transposed = flag(where, "subm", values.get("subm", 0)), flag(where, "transpose", values.get("transpose", 0))
    if subm and transposed:
        raise SparseLowerError("subm=1 contradicts transpose=1", where, "clear one of them")
    kernel = _ints(where, values, "ksize", ndim)
    geometry = dict(stride=_ints(where, values, "stride", ndim, 1), padding=_ints(where, values, "padding", ndim, 0),
                    dilation=_ints(where, values, "dilation", ndim, 1),
                    output_padding=_ints(where, values, "out_padding", ndim, 0) if transposed else (0,) * ndim)
    for name, least in (("stride", 1), ("padding", 0), ("dilation", 1), ("output_padding", 0)):
        if min(geometry[name]) < least:
            raise SparseLowerError(f"attribute '{name}'={list(geometry[name])} has a value below {least}", where,
                                   f"use values >= {least}")
    if min(kernel) < 1:
        raise SparseLowerError(f"attribute 'ksize'={list(kernel)} has a value below 1", where, "use values >= 1")
    kind = "subm" if subm else "deconv" if transposed else "conv"
    batch = values.get("batch_size")
    if batch is not None and not (isinstance(batch, int) and batch >= 1):
        raise SparseLowerError(f"attribute 'batch_size'={batch!r} is not a batch count", where,
                               "write the batches the network takes as one int >= 1, or leave it out")
    return PairNode(node, where, node.input[0], kind, tuple(grid), kernel, **geometry, batch_size=batch)


def _parse(model: onnx.ModelProto) -> tuple[dict[str, PairNode], dict[int, str]]:
    """Every pair op by each of its output names, and each conv (by node index) with the pair output it
    reads (its kernel map)."""
    pairs: dict[str, PairNode] = {}
    convs: dict[int, str] = {}
    for index, node in enumerate(model.graph.node):
        where = node_label(node, index)
        if node.domain == DOMAIN and node.op_type in PAIR_OPS:
            pair = _pair(node, where)
            pairs.update({name: pair for name in node.output})
        elif node.domain == DOMAIN and node.op_type in CONV_OPS:
            implicit = node.op_type == "ImplicitGemm"
            if len(node.input) not in ((5, 6) if implicit else (5,)) or len(node.output) != 1:
                raise SparseLowerError(f"{node.op_type} takes (features, filters, the pair op's outputs"
                                       f"{', bias?' if implicit else ''}) and one output, got {len(node.input)} "
                                       f"inputs", where, "export the node as the writer does")
            source = node.input[2]
            pair = pairs.get(source)
            if pair is None or source != pair.node.output[1] or (implicit) != (pair.node.op_type == PAIR_OPS[0]):
                raise SparseLowerError(f"its kernel map '{source}' is not output 1 of a "
                                       f"{PAIR_OPS[0] if implicit else PAIR_OPS[1]} node", where,
                                       "feed the pair op's outputs as the writer does")
            if implicit and list(node.input[3:5]) != list(pair.node.output[2:4]):
                raise SparseLowerError(f"it reads pair_mask/mask_argsort of another node than '{pair.where}'", where,
                                       "feed outputs 1 to 3 of one GetIndicePairsImplicitGemm")
            convs[index] = source
        elif node.domain != "":
            raise SparseLowerError(f"unknown op '{node.domain}::{node.op_type}' in an Autoware model", where,
                                   "replace it with standard ONNX ops")
    return pairs, convs


def _order(model: onnx.ModelProto, pairs: dict[str, PairNode], convs: dict[int, str]) -> list[int]:
    """The nodes the outputs need, in an order where every conv comes before the readers of its pair
    op's out_indices/num_act_out (which the conv's output coords now produce). A conv depends on its
    features, weights and the pair op's input coordinates; pair ops are not emitted."""
    graph = model.graph
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        if index in convs or node.domain == "":
            producer.update({name: index for name in node.output})
    first_conv: dict[int, int] = {}  # pair node id -> the first conv reading it
    for index, source in sorted(convs.items()):
        first_conv.setdefault(id(pairs[source].node), index)
    for name, pair in pairs.items():
        if name in pair.readable() and id(pair.node) in first_conv:
            producer[name] = first_conv[id(pair.node)]

    def needs(index: int) -> list[str]:
        node = graph.node[index]
        if index in convs:
            return [*node.input[:2], *node.input[5:6], pairs[convs[index]].indices]
        return list(node.input)

    dependencies = nx.DiGraph()
    wanted = [producer[o.name] for o in graph.output if o.name in producer]
    seen = set(wanted)
    while wanted:
        index = wanted.pop()
        dependencies.add_node(index)
        for name in needs(index):
            if name in pairs and name not in pairs[name].readable():
                raise SparseLowerError(f"reads '{name}', the kernel-map data of '{pairs[name].where}', which "
                                       f"sparse_lower builds inside its convs", node_label(graph.node[index], index),
                                       "read only out_indices and num_act_out of a pair op")
            if name in pairs and name not in producer:
                raise SparseLowerError(f"reads '{name}' of '{pairs[name].where}', whose kernel map no conv uses",
                                       node_label(graph.node[index], index), "remove the pair op's unused outputs")
            if name in producer:
                dependencies.add_edge(producer[name], index)
                if producer[name] not in seen:
                    seen.add(producer[name])
                    wanted.append(producer[name])
    return list(nx.lexicographical_topological_sort(dependencies))


def _check_grid(pair: PairNode, grids: dict[str, tuple[int, ...]]) -> None:
    """A pair op reading an earlier pair op's out_indices must declare the grid those coordinates lie on
    (that layer's output grid): the plugins take spatial_shape as it is written, and coordinates outside
    it would fail only at run time."""
    if pair.indices in grids and grids[pair.indices] != pair.grid:
        raise SparseLowerError(f"spatial_shape={list(pair.grid)} contradicts the grid {list(grids[pair.indices])} of "
                               f"its indices '{pair.indices}'", pair.where,
                               "write spatial_shape as the output grid of the layer that made its indices")


def _conv(t: Translation, node: onnx.NodeProto, where: str, pair: PairNode, done: dict[str, str]) -> tuple[int, ...]:
    """The source-op conv of an ImplicitGemm/IndiceConv node, and its pair op's readable outputs; returns
    the conv's output grid."""
    values = attribute_values(node, where)
    unknown = sorted(set(values) - set(_CONV_ATTRIBUTES))
    if unknown:
        raise SparseLowerError(f"{node.op_type} has no attribute {', '.join(unknown)}", where,
                               f"remove it; it takes {', '.join(_CONV_ATTRIBUTES)}")
    if flag(where, "is_subm", values.get("is_subm", int(pair.kind == "subm"))) != (pair.kind == "subm"):
        raise SparseLowerError(f"is_subm={values['is_subm']} contradicts subm of its pair op '{pair.where}'", where,
                               "export the conv and its pair op from one layer")
    features, filters = node.input[0], node.input[1]
    weight = t.constant(filters, where, "filters")
    if weight.shape[1:-1] != pair.kernel:
        raise SparseLowerError(f"filters of shape {list(weight.shape)} contradict ksize={list(pair.kernel)} of its "
                               f"pair op '{pair.where}'", where, "give the filters as [Cout, *ksize, Cin]")
    act_type = values.get("act_type", 0)
    if act_type not in _ACTIVATIONS:
        raise SparseLowerError(f"act_type={act_type!r} is not understood", where,
                               "use 0 (none), 1 (ReLU), 2 (Sigmoid) or 3 (LeakyReLU)")
    layer = SpconvLayer(label=where, kind=pair.kind, in_channels=weight.shape[-1], out_channels=weight.shape[0],
                        kernel_size=pair.kernel, stride=pair.stride, padding=pair.padding, dilation=pair.dilation,
                        output_padding=pair.output_padding, input_spatial_shape=pair.grid,
                        declared_output_spatial_shape=None, rulebook=None, activation=_ACTIVATIONS[act_type])
    coords = t.int64_coords(pair.indices, where)
    inputs = [features, coords, t.add_constant(f"{where}.W", relaid_weight(layer, weight, spconv_1x1=False))]
    if len(node.input) == 6 and node.input[5]:
        inputs.append(t.add_constant(f"{where}.B", checked_bias(layer, t.constant(node.input[5], where, "bias"))))
    output = node.output[0]
    linear = t.fresh(f"{output}_linear") if layer.activation else output
    out_coords = t.fresh(f"{where}.coords")
    conv, extent = source_node(layer, inputs, [linear, out_coords], t.node_name(where), t.note)
    t.append(conv)
    t.rows[linear] = (coords if pair.kind == "subm" else out_coords, layer.out_channels)
    if layer.activation:
        alpha = {}
        if layer.activation == "LeakyRelu":
            slope = values["act_alpha"] if "act_alpha" in values else t.leaky_relu_slope(where, AutowareFormat.engine)
            alpha = {"alpha": float(slope)}
        t.emit(layer.activation, [linear], [output], f"{where}.activation", **alpha)
    _pair_outputs(t, pair, coords if pair.kind == "subm" else out_coords, done)
    return tuple(extent)


def _pair_outputs(t: Translation, pair: PairNode, coords: str, done: dict[str, str]) -> None:
    """out_indices (int32 coords) and num_act_out (int32 row count) of a pair op, from its first conv."""
    out_indices, num_act_out = pair.node.output[0], pair.node.output[-1]
    if out_indices in done:
        return
    done[out_indices] = done[num_act_out] = pair.where
    t.emit("Cast", [coords], [out_indices], f"{pair.where}.out_indices", to=TensorProto.INT32)
    shape, rows = t.fresh(f"{pair.where}.shape"), t.fresh(f"{pair.where}.rows")
    t.emit("Shape", [coords], [shape], f"{pair.where}.shape")
    t.emit("Gather", [shape, t.add_constant(f"{pair.where}.row_axis", np.array(0, np.int64))], [rows],
           f"{pair.where}.rows")
    t.emit("Cast", [rows], [num_act_out], f"{pair.where}.num_act_out", to=TensorProto.INT32)


def _describe_coordinates(t: Translation, model: onnx.ModelProto, pairs: dict[str, PairNode]) -> None:
    """Record which graph input holds the coordinates, column by column (found by running the ops that
    turn it into the first pair op's indices), so that the imported model says how to feed it. A batch
    column ranges over the pair op's `batch_size`: the batches the traced `.dense()` holds."""
    first = next((pair for pair in pairs.values() if pair.indices not in pairs), None)
    if first is None:
        return
    columns = coordinate_columns(model, first.indices)
    if columns is None:
        t.note(first.where, f"the graph input its coordinates '{first.indices}' come from could not be traced")
        return
    source, mapping = columns
    spatial = sorted(axis for axis in mapping if axis >= 0)
    if spatial != list(range(len(first.grid))):
        raise SparseLowerError(f"its indices '{first.indices}' (from '{source}') hold {len(spatial)} spatial columns, "
                               f"but spatial_shape={list(first.grid)} has {len(first.grid)} dimensions", first.where,
                               f"feed indices [N, {1 + len(first.grid)}]: the batch, then one column per dimension")
    t.describe_coords(source, [f"d{axis}" if axis >= 0 else "batch" for axis in mapping],
                      [first.grid[axis] if axis >= 0 else first.batch_size for axis in mapping])
