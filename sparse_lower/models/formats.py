"""Emitters of the sparse-conv ONNX found in the wild (DESIGN.md §6), the test inputs of the importers.

Both write one `SparseConvolution` node per conv, with spconv's module attributes:

    ndim, input_spatial_shape, output_spatial_shape, in_channels, out_channels, kernel_size,
    output_bound (200000), stride, dilation, padding, transposed, inverse, output_padding, groups,
    subm, rulebook, activation, input_shape, output_shape

* weights stay in spconv's [Cout, *K, Cin] layout, bias [Cout];
* `activation` ("ReLU", "LeakyReLU", "Sigmoid" or "None") is fused into the conv, as the NVIDIA
  exporter does; LeakyReLU means slope `LEAKY_RELU_ALPHA` (no format carries the slope);
* `rulebook` is the indice_key, or "" for a layer without one: "" means "no shared rulebook" and must
  never be read as a key shared by every such layer;
* an inverse conv carries the attributes of spconv's SparseInverseConv module (stride 1, padding 0,
  dilation 1, inverse 1, transposed 0, output_padding 0): its real geometry is the one of the conv with
  the same `rulebook`, and `output_spatial_shape` is that conv's input extent;
* `input_shape` / `output_shape` are the feature shapes [N, C]; a real export holds the row count of
  the sample it was traced with, which says nothing about other inputs, so these files write -1;
* Relu and Add are standard nodes on the features; `dense` is a `ScatterDense` (`input_spatial_shape`,
  `format` = the spatial axes' letters, "zyx" in 3D, `output_shape` [B, C, *S]).

The two formats differ in:

* `NvidiaEmitter` (Lidar_AI_Solution's exptool, for libspconv): default domain, float16 initializers
  and features, graph input "0" [N, Cin], no coordinates in the graph, `reshape` as a Reshape with a
  non-standard `dims` attribute and no shape input, opset ai.onnx 11. Not valid for onnx.checker, as
  the real files.
* `AimetEmitter` (Qualcomm AIMET's spconv export, for QNN): domain "spconv" for SparseConvolution and
  ScatterDense, whose first input is the indices the features sit on, then the features. The
  network's indices are the int32 graph input `indices` [N, 1 + D]; a conv that makes new rows (all
  but "subm") outputs its indices as a second output, which the layers after it take; float32 (AIMET
  exports float models and keeps its quantisation encodings apart); `reshape` as a standard Reshape
  (torch.onnx); opsets ai.onnx 11 and spconv 1.

Both keep IR version 10 so that tools without onnxruntime load them. Values are named by numbers, as
torch.onnx does; graph outputs are named as in `CanonicalEmitter` (`layers.output_name`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from .emitter import Dense, Sparse, spconv_weight_memory
from .graph_writer import GraphWriter
from .layers import ConvLayer, ConvPlanner, Values, check_add, check_reshape, output_name, rows_after

OUTPUT_BOUND = 200000
_AXES = "zyx"


class _WildEmitter:
    """What the two formats share; subclasses set the domain, the float type and the I/O conventions."""

    domain = ""
    float_type = TensorProto.FLOAT16
    opsets: dict[str, int] = {"": 11}

    def __init__(self, name: str = "sparse_network"):
        self.name = name
        self.writer = GraphWriter()
        self.planner = ConvPlanner()
        self.batch_size: int | None = None
        self._values = 0
        self._layers = 0

    @property
    def _np_float(self):
        return np.float16 if self.float_type == TensorProto.FLOAT16 else np.float32

    def _value(self) -> str:
        self._values += 1
        return str(self._values)

    def _inputs(self, channels: int, ndim: int) -> tuple[str, str | None]:
        """Declare the graph inputs; return the names of the features and of the indices (if any)."""
        raise NotImplementedError

    def _with_indices(self, x: Sparse) -> list[str]:
        """The inputs of SparseConvolution and ScatterDense before the weights: [indices?, features]."""
        return [x.handle.features]

    def _conv_outputs(self, layer: ConvLayer) -> list[str]:
        return [self._value()]

    def input(self, channels: int, spatial_shape: Sequence[int], batch_size: int) -> Sparse:
        self.batch_size = batch_size
        features, indices = self._inputs(channels, len(spatial_shape))
        return Sparse(Values(features, indices, features), channels, tuple(spatial_shape))

    def conv(self, x: Sparse, kind: str, weight: np.ndarray, bias: np.ndarray | None, *, stride=1, padding=0,
             dilation=1, output_padding=0, indice_key: str | None = None, activation: str | None = None,
             name: str | None = None) -> Sparse:
        self._layers += 1
        name = self.writer.unique(name or f"{kind}{self._layers}")
        layer = self.planner.plan(x, kind, weight, bias, name=name, stride=stride, padding=padding,
                                  dilation=dilation, output_padding=output_padding, indice_key=indice_key,
                                  activation=activation)
        memory = spconv_weight_memory(weight, layer.kind, layer.stride)  # what the exported module holds
        inputs = [*self._with_indices(x), self.writer.constant(f"{name}.weight", memory.astype(self._np_float))]
        if bias is not None:
            inputs.append(self.writer.constant(f"{name}.bias", np.asarray(bias).astype(self._np_float)))
        out, *indices = self.writer.node("SparseConvolution", inputs, self._conv_outputs(layer), name=name,
                                         domain=self.domain, **self._attributes(layer))
        values = Values(out, indices[0] if indices else x.handle.coords, rows_after(layer, x, out))
        return Sparse(values, layer.out_channels, layer.output_shape)

    @staticmethod
    def _attributes(layer: ConvLayer) -> dict:
        n = layer.ndim
        # An inverse conv is written as spconv's SparseInverseConv module holds it (see the docstring).
        stride, padding, dilation = ((1,) * n, (0,) * n, (1,) * n) if layer.kind == "inverse" else \
            (layer.stride, layer.padding, layer.dilation)
        return dict(ndim=n, input_spatial_shape=list(layer.input_shape), output_spatial_shape=list(layer.output_shape),
                    in_channels=layer.in_channels, out_channels=layer.out_channels, kernel_size=list(layer.kernel),
                    output_bound=OUTPUT_BOUND, stride=list(stride), dilation=list(dilation), padding=list(padding),
                    transposed=int(layer.kind == "deconv"), inverse=int(layer.kind == "inverse"),
                    output_padding=list(layer.output_padding), groups=1, subm=int(layer.kind == "subm"),
                    rulebook=layer.indice_key or "", activation=layer.activation or "None",
                    input_shape=[-1, layer.in_channels], output_shape=[-1, layer.out_channels])

    def relu(self, x: Sparse) -> Sparse:
        self._layers += 1
        (out,) = self.writer.node("Relu", [x.handle.features], [self._value()], name=f"relu{self._layers}")
        return Sparse(Values(out, x.handle.coords, x.handle.rows), x.channels, x.spatial_shape)

    def add(self, a: Sparse, b: Sparse) -> Sparse:
        check_add(a, b)
        self._layers += 1
        (out,) = self.writer.node("Add", [a.handle.features, b.handle.features], [self._value()],
                                  name=f"add{self._layers}")
        return Sparse(Values(out, a.handle.coords, a.handle.rows), a.channels, a.spatial_shape)

    def dense(self, x: Sparse) -> Dense:
        self._layers += 1
        shape = (self.batch_size, x.channels, *x.spatial_shape)
        (out,) = self.writer.node("ScatterDense", self._with_indices(x), [self._value()],
                                  name=f"scatter_dense{self._layers}", domain=self.domain,
                                  input_spatial_shape=list(x.spatial_shape), format=_AXES[-len(x.spatial_shape):],
                                  output_shape=list(shape))
        return Dense(out, shape)

    def reshape(self, x: Dense, shape: Sequence[int]) -> Dense:
        shape = check_reshape(x, shape)
        self._layers += 1
        return Dense(self._reshape(x.handle, shape, f"reshape{self._layers}"), shape)

    def _reshape(self, value: str, shape: tuple, name: str) -> str:
        raise NotImplementedError

    def finish(self, outputs: Sequence[Sparse | Dense]) -> onnx.ModelProto:
        values = []
        for index, out in enumerate(outputs):
            name = output_name(index, len(outputs))
            dense = isinstance(out, Dense)
            shape = list(out.shape) if dense else [f"{name}_rows", out.channels]
            value = self.writer.rename(out.handle if dense else out.handle.features, name)
            values.append(helper.make_tensor_value_info(value, self.float_type, shape))
        return self.writer.model(self.name, values, self.opsets)


class NvidiaEmitter(_WildEmitter):
    """Lidar_AI_Solution's format (see the module docstring)."""

    def _inputs(self, channels: int, ndim: int) -> tuple[str, None]:
        return self.writer.input("0", TensorProto.FLOAT16, ["N", channels]), None

    def _reshape(self, value: str, shape: tuple, name: str) -> str:
        return self.writer.node("Reshape", [value], [self._value()], name=name, dims=list(shape))[0]


class AimetEmitter(_WildEmitter):
    """AIMET's spconv export (see the module docstring)."""

    domain = "spconv"
    float_type = TensorProto.FLOAT
    opsets = {"": 11, "spconv": 1}

    def _inputs(self, channels: int, ndim: int) -> tuple[str, str]:
        indices = self.writer.input("indices", TensorProto.INT32, ["N", 1 + ndim])
        return self.writer.input("features", TensorProto.FLOAT, ["N", channels]), indices

    def _with_indices(self, x: Sparse) -> list[str]:
        return [x.handle.coords, x.handle.features]

    def _conv_outputs(self, layer: ConvLayer) -> list[str]:
        features = self._value()
        return [features] if layer.kind == "subm" else [features, f"{features}.indices"]

    def _reshape(self, value: str, shape: tuple, name: str) -> str:
        target = self.writer.constant(f"{name}.shape", np.array(shape, np.int64))
        return self.writer.node("Reshape", [value, target], [self._value()], name=name)[0]
