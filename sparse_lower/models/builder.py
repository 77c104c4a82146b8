"""A small builder for models made of source ops, used by the samples, the demo and the tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..graph_writer import GraphWriter
from ..onnx_conventions import OPSET, SOURCE_DOMAIN


class SparseModelBuilder:
    """Chains source ops on a sparse input `features [N, cin]`, `coords [N, 1 + D]`.

    Weights are drawn from `rng` (He-scaled, so activations keep their magnitude through a stack) or
    given. `build()` returns a checked ModelProto whose outputs are the last features and coords.
    """

    def __init__(self, ndim: int, cin: int, rng: np.random.Generator, features: str = "features",
                 coords: str = "coords"):
        self.ndim = ndim
        self.rng = rng
        self.writer = GraphWriter()
        self.writer.input(features, TensorProto.FLOAT, ["N", cin])
        self.writer.input(coords, TensorProto.INT64, ["N", 1 + ndim])
        self.features, self.coords, self.channels = features, coords, cin

    def _weights(self, name: str, shape: tuple, fan_in: int) -> str:
        value = (self.rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))).astype(np.float32)
        return self.writer.constant(name, value)

    @property
    def initializers(self) -> list[onnx.TensorProto]:
        """The model's initializers so far; a caller may append its own, to read them by name."""
        return self.writer.initializers

    def conv(self, op_type: str, cout: int, kernel_shape, spatial_shape, bias: bool = True,
             target_coords: str | None = None, **attrs) -> "SparseModelBuilder":
        """Append a SubmanifoldConv / SparseConv / SparseDeconv layer (`target_coords`: the name of an
        earlier coords tensor, making a SparseDeconv an inverse conv onto those sites)."""
        index = len(self.writer.nodes)
        name = f"{op_type.lower()}{index}"
        kernel = list(kernel_shape)
        taps = int(np.prod(kernel))
        shape = (self.channels, cout, *kernel) if op_type == "SparseDeconv" else (cout, self.channels, *kernel)
        inputs = [self.features, self.coords, self._weights(f"{name}.W", shape, self.channels * taps)]
        if bias:
            inputs.append(self._weights(f"{name}.B", (cout,), 1))
        if target_coords is not None:
            inputs += ([] if bias else [""]) + [target_coords]  # target_coords is the fifth input
        self.features, self.coords = self.writer.node(op_type, inputs, [f"{name}.features", f"{name}.coords"],
                                                      name, domain=SOURCE_DOMAIN, kernel_shape=kernel,
                                                      spatial_shape=list(spatial_shape), **attrs)
        self.channels = cout
        return self

    def relu(self) -> "SparseModelBuilder":
        name = f"relu{len(self.writer.nodes)}"
        (self.features,) = self.writer.node("Relu", [self.features], [name], name)
        return self

    def add(self, features: str) -> "SparseModelBuilder":
        """Add `features` (an earlier tensor on the same coords, same channels) to the current ones: a
        residual connection."""
        name = f"add{len(self.writer.nodes)}"
        (self.features,) = self.writer.node("Add", [self.features, features], [name], name)
        return self

    def build(self, name: str = "sparse_model") -> onnx.ModelProto:
        outputs = [helper.make_tensor_value_info(self.features, TensorProto.FLOAT, [None, self.channels]),
                   helper.make_tensor_value_info(self.coords, TensorProto.INT64, [None, 1 + self.ndim])]
        model = self.writer.model(name, outputs, {"": OPSET, SOURCE_DOMAIN: 1})
        onnx.checker.check_model(model)
        return model
