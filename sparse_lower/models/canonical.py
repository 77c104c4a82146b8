"""`CanonicalEmitter`: a network as source ops plus standard ONNX ops (docs/source_ops.md).

The model takes `features` float32 [N, Cin] and `coords` int64 [N, 1 + D] (or, through
`dense_input`, a dense [B, C, *S] tensor that a ToSparse turns into rows), has float32 initializers in
ONNX layout, opsets "" 17 and "sparse" 1, IR version 10, and passes onnx.checker. It is what the
compiler takes and what the importers must produce from the wild formats of the same network.

Mapping of spconv's layers:
* "subm" → SubmanifoldConv (padding ignored, as in spconv);
* "conv" → SparseConv with the padding on both sides;
* "deconv" → SparseDeconv with output_padding (spconv's SparseConvTranspose);
* "inverse" → SparseDeconv with the forward conv's geometry, `spatial_shape` = the forward output
  extent, `output_padding` = (S_in + 2p − d·(K − 1) − 1) mod s, and the forward conv's input coords as
  `target_coords`, so outputs sit on exactly the rows spconv's SparseInverseConv gives, in that order;
* `activation` → a Relu / LeakyRelu (alpha `LEAKY_RELU_ALPHA`) / Sigmoid node after the conv;
* `dense` → ToDense; `reshape` → Reshape with an int64 shape initializer.

Graph outputs are named by `layers.output_name`: "output" (features or dense tensor) and
"output_coords" for a sparse output; "output_i" among several.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..graph_writer import GraphWriter
from ..onnx_conventions import OPSET, SOURCE_DOMAIN
from ..schemas import conv_geometry
from ..spconv_rules import LEAKY_RELU_ALPHA, source_weight
from .emitter import Dense, Sparse
from .layers import (ConvLayer, ConvPlanner, Values, check_add, check_reshape, output_name,
                     rows_after)

_SOURCE_OP = {"subm": "SubmanifoldConv", "conv": "SparseConv", "deconv": "SparseDeconv", "inverse": "SparseDeconv"}
_ACTIVATION = {"ReLU": ("Relu", {}), "LeakyReLU": ("LeakyRelu", {"alpha": LEAKY_RELU_ALPHA}),
               "Sigmoid": ("Sigmoid", {})}


def activation_node(writer: GraphWriter, features: str, activation: str | None, name: str) -> str:
    """The activation a wild format fuses into the conv, as its own standard node."""
    if activation is None:
        return features
    op_type, attrs = _ACTIVATION[activation]
    return writer.node(op_type, [features], [f"{name}.{op_type.lower()}"], name=f"{name}.{op_type.lower()}",
                       **attrs)[0]


class CanonicalEmitter:
    """Builds the source-op form of a network (see the module docstring)."""

    def __init__(self, name: str = "sparse_network"):
        self.name = name
        self.writer = GraphWriter()
        self.planner = ConvPlanner()
        self.batch_size: int | None = None
        self._count = 0

    def input(self, channels: int, spatial_shape: Sequence[int], batch_size: int) -> Sparse:
        self.batch_size = batch_size
        features = self.writer.input("features", TensorProto.FLOAT, ["N", channels])
        coords = self.writer.input("coords", TensorProto.INT64, ["N", 1 + len(spatial_shape)])
        return Sparse(Values(features, coords, coords), channels, tuple(spatial_shape))

    def dense_input(self, channels: int, spatial_shape: Sequence[int], batch_size: int) -> Sparse:
        """The network's input as a dense `X` [B, C, *S] made sparse by ToSparse (active where any channel
        is non-zero): the patent's dense-format input. Not part of the Emitter protocol: the wild formats
        have no dense input (their engines take voxels), so a network asks for it only on an emitter
        that has it."""
        self.batch_size = batch_size
        x = self.writer.input("X", TensorProto.FLOAT, [batch_size, channels, *spatial_shape])
        features, coords = self.writer.node("ToSparse", [x], ["X.features", "X.coords"], name="to_sparse",
                                            domain=SOURCE_DOMAIN)
        return Sparse(Values(features, coords, coords), channels, tuple(spatial_shape))

    def conv(self, x: Sparse, kind: str, weight: np.ndarray, bias: np.ndarray | None, *, stride=1, padding=0,
             dilation=1, output_padding=0, indice_key: str | None = None, activation: str | None = None,
             name: str | None = None) -> Sparse:
        self._count += 1
        name = self.writer.unique(name or f"{kind}{self._count}")
        layer = self.planner.plan(x, kind, weight, bias, name=name, stride=stride, padding=padding,
                                  dilation=dilation, output_padding=output_padding, indice_key=indice_key,
                                  activation=activation)
        inputs = [x.handle.features, x.handle.coords, self.writer.constant(f"{name}.W", source_weight(weight, layer.transposed))]
        if bias is not None:
            inputs.append(self.writer.constant(f"{name}.B", np.asarray(bias, np.float32)))
        if kind == "inverse":  # target_coords is the fifth input: an absent bias is the empty name
            inputs += [""] * (4 - len(inputs)) + [layer.forward.handle.coords]
        features, coords = self.writer.node(_SOURCE_OP[kind], inputs,
                                            [f"{name}.features", f"{name}.coords"], name=name,
                                            domain=SOURCE_DOMAIN, **self._attributes(layer))
        self._check_extent(layer)
        features = activation_node(self.writer, features, activation, name)
        return Sparse(Values(features, coords, rows_after(layer, x, coords)), layer.out_channels, layer.output_shape)

    @staticmethod
    def _attributes(layer: ConvLayer) -> dict:
        attrs = {"kernel_shape": list(layer.kernel), "spatial_shape": list(layer.input_shape)}
        if layer.kind != "subm":
            attrs.update(strides=list(layer.stride), pads=list(layer.padding) * 2)
        if layer.kind != "deconv":
            attrs["dilations"] = list(layer.dilation)
        if layer.kind == "deconv":
            attrs["output_padding"] = list(layer.output_padding)
        if layer.kind == "inverse":
            attrs["output_padding"] = list(layer.inverse_output_padding)
        return attrs

    def _check_extent(self, layer: ConvLayer) -> None:
        """The node's extent by the source-op rules must be the one spconv gives the layer."""
        extent = conv_geometry(self.writer.nodes[-1]).output_shape
        if extent != layer.output_shape:
            raise AssertionError(f"layer '{layer.name}': source-op extent {list(extent)} is not spconv's "
                                 f"{list(layer.output_shape)}")

    def relu(self, x: Sparse) -> Sparse:
        return self._rowwise(x, activation_node(self.writer, x.handle.features, "ReLU", self._next("relu")))

    def add(self, a: Sparse, b: Sparse) -> Sparse:
        check_add(a, b)
        name = self._next("add")
        (out,) = self.writer.node("Add", [a.handle.features, b.handle.features], [name], name=name)
        return self._rowwise(a, out)

    def _next(self, base: str) -> str:
        self._count += 1
        return self.writer.unique(f"{base}{self._count}")

    @staticmethod
    def _rowwise(x: Sparse, features: str) -> Sparse:
        return Sparse(Values(features, x.handle.coords, x.handle.rows), x.channels, x.spatial_shape)

    def bev_merge(self, parts: Sequence[tuple[Sparse, int]]) -> Sparse:
        """VoxelNeXt's bev_out over several levels (voxelnext.py): each part's coords scaled by its factor
        onto the first part's grid (`Mul`), the rows concatenated (`Concat`), the first spatial axis dropped
        (`Gather` of the other columns) and the rows that then share a site summed (`Coalesce`). Not part
        of the Emitter protocol (no wild format writes it)."""
        first = parts[0][0]
        if len({x.channels for x, _ in parts}) != 1:
            raise ValueError("bev_merge needs parts of one channel count")
        name = self._next("bev_out")
        coords = []
        for index, (x, factor) in enumerate(parts):
            if factor == 1:
                coords.append(x.handle.coords)
                continue
            scale = self.writer.constant(f"{name}.scale{index}", np.array([1] + [factor] * len(x.spatial_shape), np.int64))
            coords.append(self.writer.node("Mul", [x.handle.coords, scale], [f"{name}.coords{index}"],
                                           name=f"{name}.scale{index}")[0])
        (rows,) = self.writer.node("Concat", [x.handle.features for x, _ in parts], [f"{name}.rows"],
                                   name=f"{name}.rows", axis=0)
        (all_coords,) = self.writer.node("Concat", coords, [f"{name}.rows_coords"], name=f"{name}.rows_coords", axis=0)
        columns = self.writer.constant(f"{name}.columns", np.array([0, *range(2, 1 + len(first.spatial_shape))],
                                                                   np.int64))
        (bev_coords,) = self.writer.node("Gather", [all_coords, columns], [f"{name}.bev_coords"],
                                         name=f"{name}.drop_axis", axis=1)
        bev = tuple(first.spatial_shape[1:])
        features, merged = self.writer.node("Coalesce", [rows, bev_coords], [f"{name}.features", f"{name}.coords"],
                                            name=name, domain=SOURCE_DOMAIN, spatial_shape=list(bev), reduction="sum")
        return Sparse(Values(features, merged, merged), first.channels, bev)

    def concat_channels(self, parts: Sequence[Sparse]) -> Sparse:
        """The features of tensors on the same rows side by side (`Concat` on axis 1)."""
        if any(x.handle.rows != parts[0].handle.rows for x in parts):
            raise ValueError("concat_channels needs tensors on the same rows (same coords, same order)")
        name = self._next("concat")
        (out,) = self.writer.node("Concat", [x.handle.features for x in parts], [name], name=name, axis=1)
        return Sparse(Values(out, parts[0].handle.coords, parts[0].handle.rows), sum(x.channels for x in parts),
                      parts[0].spatial_shape)

    def dense(self, x: Sparse) -> Dense:
        name = self._next("to_dense")
        (out,) = self.writer.node("ToDense", [x.handle.features, x.handle.coords], [name], name=name,
                                  domain=SOURCE_DOMAIN, spatial_shape=list(x.spatial_shape),
                                  batch_size=self.batch_size)
        return Dense(out, (self.batch_size, x.channels, *x.spatial_shape))

    def reshape(self, x: Dense, shape: Sequence[int]) -> Dense:
        shape = check_reshape(x, shape)
        name = self._next("reshape")
        target = self.writer.constant(f"{name}.shape", np.array(shape, np.int64))
        (out,) = self.writer.node("Reshape", [x.handle, target], [name], name=name)
        return Dense(out, shape)

    def transpose(self, x: Dense, perm: Sequence[int]) -> Dense:
        perm = [int(p) for p in perm]
        name = self._next("transpose")
        (out,) = self.writer.node("Transpose", [x.handle], [name], name=name, perm=perm)
        return Dense(out, tuple(x.shape[p] for p in perm))

    def finish(self, outputs: Sequence[Sparse | Dense]) -> onnx.ModelProto:
        values = []
        for index, out in enumerate(outputs):
            name = output_name(index, len(outputs))
            if isinstance(out, Dense):
                values.append(helper.make_tensor_value_info(self.writer.rename(out.handle, name), TensorProto.FLOAT,
                                                            list(out.shape)))
                continue
            rows = f"{name}_rows"
            values += [helper.make_tensor_value_info(self.writer.rename(out.handle.features, name), TensorProto.FLOAT,
                                                     [rows, out.channels]),
                       helper.make_tensor_value_info(self.writer.rename(out.handle.coords, f"{name}_coords"),
                                                     TensorProto.INT64, [rows, 1 + len(out.spatial_shape)])]
        model = self.writer.model(self.name, values, {"": OPSET, SOURCE_DOMAIN: 1})
        onnx.checker.check_model(model, full_check=True)
        return model
