"""A small builder for models made of source ops, used by the samples, the demo and the tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..onnx_conventions import IR_VERSION, OPSET, SOURCE_DOMAIN


class SparseModelBuilder:
    """Chains source ops on a sparse input `features [N, cin]`, `coords [N, 1 + D]`.

    Weights are drawn from `rng` (He-scaled, so activations keep their magnitude through a stack) or
    given. `build()` returns a checked ModelProto whose outputs are the last features and coords.
    """

    def __init__(self, ndim: int, cin: int, rng: np.random.Generator, features: str = "features",
                 coords: str = "coords"):
        self.ndim = ndim
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs = [helper.make_tensor_value_info(features, TensorProto.FLOAT, ["N", cin]),
                       helper.make_tensor_value_info(coords, TensorProto.INT64, ["N", 1 + ndim])]
        self.features, self.coords, self.channels = features, coords, cin

    def _weights(self, name: str, shape: tuple, fan_in: int) -> str:
        value = (self.rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))).astype(np.float32)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def conv(self, op_type: str, cout: int, kernel_shape, spatial_shape, bias: bool = True,
             target_coords: str | None = None, **attrs) -> "SparseModelBuilder":
        """Append a SubmanifoldConv / SparseConv / SparseDeconv layer (`target_coords`: the name of an
        earlier coords tensor, making a SparseDeconv an inverse conv onto those sites)."""
        index = len(self.nodes)
        name = f"{op_type.lower()}{index}"
        kernel = list(kernel_shape)
        taps = int(np.prod(kernel))
        shape = (self.channels, cout, *kernel) if op_type == "SparseDeconv" else (cout, self.channels, *kernel)
        inputs = [self.features, self.coords, self._weights(f"{name}.W", shape, self.channels * taps)]
        if bias:
            inputs.append(self._weights(f"{name}.B", (cout,), 1))
        if target_coords is not None:
            inputs += ([] if bias else [""]) + [target_coords]  # target_coords is the fifth input
        outputs = [f"{name}.features", f"{name}.coords"]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, domain=SOURCE_DOMAIN,
                                           kernel_shape=kernel, spatial_shape=list(spatial_shape), **attrs))
        self.features, self.coords, self.channels = outputs[0], outputs[1], cout
        return self

    def relu(self) -> "SparseModelBuilder":
        output = f"relu{len(self.nodes)}"
        self.nodes.append(helper.make_node("Relu", [self.features], [output], name=output))
        self.features = output
        return self

    def add(self, features: str) -> "SparseModelBuilder":
        """Add `features` (an earlier tensor on the same coords, same channels) to the current ones: a
        residual connection."""
        output = f"add{len(self.nodes)}"
        self.nodes.append(helper.make_node("Add", [self.features, features], [output], name=output))
        self.features = output
        return self

    def build(self, name: str = "sparse_model") -> onnx.ModelProto:
        outputs = [helper.make_tensor_value_info(self.features, TensorProto.FLOAT, [None, self.channels]),
                   helper.make_tensor_value_info(self.coords, TensorProto.INT64, [None, 1 + self.ndim])]
        graph = helper.make_graph(self.nodes, name, self.inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                        helper.make_opsetid(SOURCE_DOMAIN, 1)])
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model
