"""Writers of the sparse-conv ONNX found in the wild: the reference networks as the real exporters write
them, for the importers' tests, the demo and the benchmarks.

They write what the real tools write, node for node, attribute for attribute (checked against files
those tools wrote, in tests/test_wild.py); they are not a definition of the formats, which is the
exporters' code and what their engines read (docs/formats.md).

* `NvidiaEmitter`: Lidar_AI_Solution's `exptool.py` (CenterPoint, BEVFusion; libspconv). Written with
  `onnx.helper`: `opset_import = [("ai.onnx", 11)]`, graph "scn", producer "pytorch" 1.9, the IR version
  of the installed onnx; the graph input "0" FLOAT16 `[N, Cin]` and the FLOAT16 output with the traced
  frame's shapes; tensors named by running numbers in the order they appear ("0" the input), nodes
  `conv<i>`, `relu<i>`, `add<i>`, `scatter<i>`, `reshape<i>`, `transpose<i>` (one counter per kind),
  weights `spconv<i>.weight` / `.bias` as FLOAT16 raw data in spconv's KRSC layout;
  `SparseConvolution` with every spconv module attribute (`rulebook` left out where the layer has no
  indice_key, `activation` the fused one, `input_shape`/`output_shape` the traced feature shapes);
  `ScatterDense` (`input_spatial_shape`, `format`, `output_shape`), and `Reshape`/`Transpose` with a
  non-standard `dims` attribute. `coords_order="xyz"` writes BEVFusion's `--origin` export: every
  spatial axis reversed (the grid, kernels, strides, paddings, the weights' tap axes: the coordinates
  are (batch, x, y, z)), `ScatterDense` with format "xyz" and the dense axes in that order, so the
  network's first permute of the dense tensor absorbs the reversal (BEVFusion's `permute(0, 1, 4, 2, 3)`).
  The traced frame is one zero voxel, as the exporters trace without `--input`, unless `traced_coords`
  gives a frame.
* `AimetEmitter`: aimet_torch's spconv export (torch.onnx, opsets ("", 16) and ("spconv", 1), IR 8).
  Inputs `indices` int32 and `features` float32, whose row count is the whole grid (AIMET can only
  trace a fully dense grid); the first `spconv::SparseConvolution(indices, features, W, B)`, later ones
  `(x, W, B)` with x declared dense NCDHW in value_info; attributes whose value is 0 or false left out;
  `rulebook` "subm<flag>"; `batch_size` and `spatial_shape` on later layers; activations as standard
  nodes (AIMET's layer fuses none); `spconv::ScatterDense(x)` with format "xyz". AIMET's layer wraps a
  3D `SparseConv3d`: 1D/2D networks and transposed or inverse convs cannot be written.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from .. import reference
from ..graph_writer import GraphWriter
from ..onnx_conventions import DEFAULT_DOMAIN_ALIAS
from ..spconv_rules import LEAKY_RELU_ALPHA
from .emitter import Dense, Sparse, spconv_weight_memory
from .layers import ConvLayer, ConvPlanner, Values, check_add, check_reshape, rows_after

OUTPUT_BOUND = 200000  # exptool's default capacity
_ACTIVATION_OPS = {"ReLU": ("Relu", {}), "LeakyReLU": ("LeakyRelu", {"alpha": LEAKY_RELU_ALPHA}),
                   "Sigmoid": ("Sigmoid", {})}


def _traced(layer: ConvLayer, coords: np.ndarray, forward_coords: np.ndarray | None) -> np.ndarray:
    """The coordinates a conv outputs for input `coords`, by the source ops' definition (the reference): the
    rows an exporter's trace sees, for the traced feature shapes."""
    if layer.kind == "subm":
        return coords
    if layer.kind == "inverse":
        return forward_coords
    zeros, weight = np.zeros((len(coords), 1), np.float32), np.zeros((1, 1, *layer.kernel), np.float32)
    attrs = dict(kernel_shape=list(layer.kernel), spatial_shape=list(layer.input_shape), strides=list(layer.stride),
                 pads=list(layer.padding) * 2)
    if layer.kind == "conv":
        return reference.sparse_conv(zeros, coords, weight, dilations=list(layer.dilation), **attrs)[1]
    return reference.sparse_deconv(zeros, coords, weight, output_padding=list(layer.output_padding), **attrs)[1]


class _Writer:
    """The graph and the layer planner; subclasses set the conventions of one exporter."""

    def __init__(self):
        self.writer = GraphWriter()
        self.planner = ConvPlanner()


class NvidiaEmitter(_Writer):
    """Lidar_AI_Solution's exptool (see the module docstring)."""

    def __init__(self, coords_order: str = "zyx", traced_coords: np.ndarray | None = None):
        super().__init__()
        if coords_order not in ("zyx", "xyz"):
            raise ValueError(f"coords_order must be 'zyx' or 'xyz', not {coords_order!r}")
        self.reversed = coords_order == "xyz"
        self.traced_coords = traced_coords
        self.batch_size = 1
        self._ids = 0
        self._counts: Counter = Counter()
        self._sites: dict[str, np.ndarray] = {}  # tensor id -> the traced coordinates (network order)
        self._reversed_dense: set[str] = set()  # xyz export: dense tensors whose spatial axes are reversed

    def _id(self) -> str:
        name = str(self._ids)
        self._ids += 1
        return name

    def _name(self, kind: str) -> str:
        index = self._counts[kind]
        self._counts[kind] += 1
        return f"{kind}{index}"

    def _axes(self, values) -> list[int]:
        """Per-dimension values in the file's axis order."""
        values = [int(v) for v in values]
        return values[::-1] if self.reversed else values

    def input(self, channels: int, spatial_shape: Sequence[int], batch_size: int) -> Sparse:
        self.batch_size = batch_size
        coords = self.traced_coords if self.traced_coords is not None else \
            np.zeros((1, 1 + len(spatial_shape)), np.int64)
        name = self._id()
        self.writer.input(name, TensorProto.FLOAT16, [len(coords), channels])
        self._sites[name] = np.asarray(coords, np.int64)
        return Sparse(Values(name, None, name), channels, tuple(spatial_shape))

    def conv(self, x: Sparse, kind: str, weight: np.ndarray, bias: np.ndarray | None, *, stride=1, padding=0,
             dilation=1, output_padding=0, indice_key: str | None = None, activation: str | None = None,
             name: str | None = None) -> Sparse:
        layer = self.planner.plan(x, kind, weight, bias, name=name or kind, stride=stride, padding=padding,
                                  dilation=dilation, output_padding=output_padding, indice_key=indice_key,
                                  activation=activation)
        node, index = self._name("conv"), self._counts["conv"] - 1
        memory = spconv_weight_memory(weight, layer.kind, layer.stride)  # what the exported module holds
        if self.reversed:  # the tap axes in the file's axis order
            memory = np.transpose(memory, (0, *range(layer.ndim, 0, -1), layer.ndim + 1))
        inputs = [x.handle.features, self.writer.constant(f"spconv{index}.weight", memory.astype(np.float16))]
        if bias is not None:
            inputs.append(self.writer.constant(f"spconv{index}.bias", np.asarray(bias).astype(np.float16)))
        out = self._id()
        forward = self._sites[layer.forward.handle.features] if layer.forward is not None else None
        sites = _traced(layer, self._sites[x.handle.features], forward)
        self._sites[out] = sites
        # an inverse conv is written as spconv's SparseInverseConv module holds it: stride 1, padding 0
        n = layer.ndim
        stride, padding, dilation = ((1,) * n, (0,) * n, (1,) * n) if layer.kind == "inverse" else \
            (layer.stride, layer.padding, layer.dilation)
        self.writer.node("SparseConvolution", inputs, [out], node,
                         ndim=n, input_spatial_shape=self._axes(layer.input_shape),
                         output_spatial_shape=self._axes(layer.output_shape), in_channels=layer.in_channels,
                         out_channels=layer.out_channels, kernel_size=self._axes(layer.kernel),
                         output_bound=OUTPUT_BOUND, stride=self._axes(stride), dilation=self._axes(dilation),
                         padding=self._axes(padding), transposed=int(layer.kind == "deconv"),
                         inverse=int(layer.kind == "inverse"), output_padding=self._axes(layer.output_padding),
                         groups=1, subm=int(layer.kind == "subm"), rulebook=layer.indice_key,
                         activation=layer.activation or "None",
                         input_shape=[len(self._sites[x.handle.features]), layer.in_channels],
                         output_shape=[len(sites), layer.out_channels])
        return Sparse(Values(out, None, rows_after(layer, x, out)), layer.out_channels, layer.output_shape)

    def relu(self, x: Sparse) -> Sparse:
        out = self._id()
        self._sites[out] = self._sites[x.handle.features]
        self.writer.node("Relu", [x.handle.features], [out], self._name("relu"))
        return Sparse(Values(out, None, x.handle.rows), x.channels, x.spatial_shape)

    def add(self, a: Sparse, b: Sparse) -> Sparse:
        check_add(a, b)
        out = self._id()
        self._sites[out] = self._sites[a.handle.features]
        self.writer.node("Add", [a.handle.features, b.handle.features], [out], self._name("add"))
        return Sparse(Values(out, None, a.handle.rows), a.channels, a.spatial_shape)

    def dense(self, x: Sparse) -> Dense:
        shape = [self.batch_size, x.channels, *self._axes(x.spatial_shape)]
        out = self._id()
        self.writer.node("ScatterDense", [x.handle.features], [out], self._name("scatter"),
                         input_spatial_shape=self._axes(x.spatial_shape),
                         format="xyz" if self.reversed else "zyx", output_shape=shape)
        if self.reversed:  # the network's next op on it undoes the reversal
            self._reversed_dense.add(out)
        return Dense(out, (self.batch_size, x.channels, *x.spatial_shape))

    def transpose(self, x: Dense, perm: Sequence[int]) -> Dense:
        perm = [int(p) for p in perm]
        dims = perm
        if x.handle in self._reversed_dense:
            undo = [0, 1, *range(len(x.shape) - 1, 1, -1)]  # file axis i is network axis undo[i]
            dims = [undo[p] for p in perm]
        out = self._id()
        self.writer.node("Transpose", [x.handle], [out], self._name("transpose"), dims=dims)
        return Dense(out, tuple(x.shape[p] for p in perm))

    def reshape(self, x: Dense, shape: Sequence[int]) -> Dense:
        shape = check_reshape(x, shape)
        if x.handle in self._reversed_dense:
            x = self.transpose(x, list(range(len(x.shape))))
        out = self._id()
        self.writer.node("Reshape", [x.handle], [out], self._name("reshape"), dims=list(shape))
        return Dense(out, shape)

    def finish(self, outputs: Sequence[Sparse | Dense]) -> onnx.ModelProto:
        values = []
        for out in outputs:
            if isinstance(out, Dense):
                values.append(helper.make_tensor_value_info(out.handle, TensorProto.FLOAT16, list(out.shape)))
            else:
                rows = len(self._sites[out.handle.features])
                values.append(helper.make_tensor_value_info(out.handle.features, TensorProto.FLOAT16,
                                                            [rows, out.channels]))
        return helper.make_model(self.writer.graph("scn", values),
                                 opset_imports=[helper.make_operatorsetid(DEFAULT_DOMAIN_ALIAS, 11)],
                                 producer_name="pytorch", producer_version="1.9")


class AimetEmitter(_Writer):
    """aimet_torch's spconv export (see the module docstring)."""

    IR_VERSION = 8  # torch.onnx's

    def __init__(self):
        super().__init__()
        self.batch_size = 1
        self._counts: Counter = Counter()
        self._outputs = 0

    def _scope(self, kind: str) -> str:
        index = self._counts[kind]
        self._counts[kind] += 1
        return f"{kind}{index + 1}"

    def input(self, channels: int, spatial_shape: Sequence[int], batch_size: int) -> Sparse:
        if len(spatial_shape) != 3:
            raise ValueError(f"AIMET's spconv export is 3D only (CustomSparseConv3DLayer), not {len(spatial_shape)}D")
        self.batch_size = batch_size
        rows = batch_size * int(np.prod(spatial_shape))  # AIMET traces a fully dense grid only
        self.writer.input("indices", TensorProto.INT32, [rows, 4])
        self.writer.input("features", TensorProto.FLOAT, [rows, channels])
        return Sparse(Values("features", "indices", "features"), channels, tuple(spatial_shape))

    def _declare_dense(self, name: str, scope: str) -> None:
        self.writer.value_info.append(helper.make_tensor_value_info(
            name, TensorProto.FLOAT, [f"{scope}_dim_{i}" for i in range(5)]))

    def conv(self, x: Sparse, kind: str, weight: np.ndarray, bias: np.ndarray | None, *, stride=1, padding=0,
             dilation=1, output_padding=0, indice_key: str | None = None, activation: str | None = None,
             name: str | None = None) -> Sparse:
        if kind not in ("conv", "subm"):
            raise ValueError(f"AIMET's spconv export has no {kind} conv (its layer wraps spconv.SparseConv3d)")
        layer = self.planner.plan(x, kind, weight, bias, name=name or kind, stride=stride, padding=padding,
                                  dilation=dilation, output_padding=output_padding, indice_key=indice_key,
                                  activation=activation)
        scope = self._scope("spconv")
        weights = [self.writer.constant(f"{scope}.sp_conv_3d.weight",
                                        spconv_weight_memory(weight, layer.kind, layer.stride)),
                   self.writer.constant(f"{scope}.sp_conv_3d.bias", np.zeros(layer.out_channels, np.float32)
                                        if bias is None else np.asarray(bias, np.float32))]
        grid_rows = self.batch_size * int(np.prod(layer.input_shape))
        attrs = dict(activation="None", dilation=list(layer.dilation), groups=1, in_channels=layer.in_channels,
                     input_shape=[grid_rows, layer.in_channels], input_spatial_shape=list(layer.input_shape),
                     kernel_size=list(layer.kernel), ndim=3, out_channels=layer.out_channels,
                     output_bound=grid_rows, padding=list(layer.padding), rulebook=f"subm{int(kind == 'subm')}",
                     stride=list(layer.stride))
        if kind == "subm":
            attrs["subm"] = 1
        if x.handle.features == "features":  # a layer called on (indices, features)
            inputs = ["indices", x.handle.features]
        else:
            inputs = [x.handle.features]
            attrs.update(batch_size=self.batch_size, spatial_shape=list(layer.input_shape))
        out = f"/{scope}/SparseConvolution_output_0"
        self.writer.node("SparseConvolution", [*inputs, *weights], [out], f"/{scope}/SparseConvolution",
                         domain="spconv", **attrs)
        self._declare_dense(out, f"SparseConvolution/{scope}/SparseConvolution_output_0")
        y = Sparse(Values(out, "indices", rows_after(layer, x, out)), layer.out_channels, layer.output_shape)
        if activation is None:
            return y
        op_type, extra = _ACTIVATION_OPS[activation]
        act = f"/{scope}_act/{op_type}_output_0"
        self.writer.node(op_type, [out], [act], f"/{scope}_act/{op_type}", **extra)
        return Sparse(Values(act, "indices", y.handle.rows), y.channels, y.spatial_shape)

    def relu(self, x: Sparse) -> Sparse:
        scope = self._scope("relu")
        out = f"/{scope}/Relu_output_0"
        self.writer.node("Relu", [x.handle.features], [out], f"/{scope}/Relu")
        return Sparse(Values(out, "indices", x.handle.rows), x.channels, x.spatial_shape)

    def add(self, a: Sparse, b: Sparse) -> Sparse:
        check_add(a, b)
        scope = self._scope("add")
        out = f"/{scope}/Add_output_0"
        self.writer.node("Add", [a.handle.features, b.handle.features], [out], f"/{scope}/Add")
        return Sparse(Values(out, "indices", a.handle.rows), a.channels, a.spatial_shape)

    def _output(self) -> str:
        self._outputs += 1
        return str(self._outputs)

    def dense(self, x: Sparse) -> Dense:
        shape = (self.batch_size, x.channels, *x.spatial_shape)
        out = self._output()
        self.writer.node("ScatterDense", [x.handle.features], [out],
                         f"/{self._scope('spconv_scatter_dense')}/ScatterDense", domain="spconv", format="xyz",
                         input_spatial_shape=list(x.spatial_shape), output_shape=list(shape))
        return Dense(out, shape)

    def transpose(self, x: Dense, perm: Sequence[int]) -> Dense:
        out = self._output()
        self.writer.node("Transpose", [x.handle], [out], f"/{self._scope('transpose')}/Transpose",
                         perm=[int(p) for p in perm])
        return Dense(out, tuple(x.shape[int(p)] for p in perm))

    def reshape(self, x: Dense, shape: Sequence[int]) -> Dense:
        shape = check_reshape(x, shape)
        scope = self._scope("reshape")
        target = self.writer.constant(f"/{scope}/Constant_output_0", np.asarray(shape, np.int64))
        out = self._output()
        self.writer.node("Reshape", [x.handle, target], [out], f"/{scope}/Reshape")
        return Dense(out, shape)

    def finish(self, outputs: Sequence[Sparse | Dense]) -> onnx.ModelProto:
        values = []
        for index, out in enumerate(outputs):
            if not isinstance(out, Dense):
                raise ValueError("AIMET's export returns dense tensors: end the network with dense()")
            values.append(helper.make_tensor_value_info(
                out.handle, TensorProto.FLOAT, [f"{out.handle}_dim_{i}" for i in range(len(out.shape))]))
        model = helper.make_model(self.writer.graph("main_graph", values),
                                  opset_imports=[helper.make_opsetid("", 16), helper.make_opsetid("spconv", 1)],
                                  producer_name="pytorch", producer_version="2.13.0")
        model.ir_version = self.IR_VERSION
        return model
