"""Device capability tables: which device can run which node, and why not.

A predicate takes a node and the model's type oracle and returns None when the device can run the
node, else the reason it cannot. Predicates know ONNX ops and devices, never the lowering rules that
produced the graph, and the partitioning algorithm knows nothing of them but this signature (the
split of torch.fx's CapabilityBasedPartitioner).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import TensorProto

from ..onnx_conventions import CUSTOM_DOMAIN, SOURCE_DOMAIN, STANDARD_DOMAINS
from .value_types import ValueTypes

Predicate = Callable[[onnx.NodeProto, ValueTypes], "str | None"]

ACCELERATOR = "nna"  # the device whose segments toolchains compile and int8 quantizes

# Dense float compute an accelerator's compiler maps to its engines.
NNA_OPS = frozenset({
    "Conv", "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "Sigmoid", "Clip",
    "Gather", "ScatterND", "ScatterElements", "Reshape", "Transpose", "Concat", "Slice", "Pad", "Split",
    "ReduceSum", "ReduceMax", "Unsqueeze", "Squeeze", "Identity", "Flatten", "MaxPool", "AveragePool",
    "BatchNormalization",
})
NNA_ELEM_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)


def op_label(node: onnx.NodeProto) -> str:
    """`Conv` for a standard op, `sparse_lower::IndexedFold` for any other domain."""
    return f"{node.domain}::{node.op_type}" if node.domain not in STANDARD_DOMAINS else node.op_type


def _library_domains(node: onnx.NodeProto, device: str) -> str | None:
    """Our library's devices run the standard domain and our custom ops; unlowered source ops and
    foreign domains run nowhere."""
    if node.domain == SOURCE_DOMAIN:
        return "not lowered; run sparse_lower.lower first"
    if node.domain in STANDARD_DOMAINS or node.domain == CUSTOM_DOMAIN:
        return None
    return f"{op_label(node)}: the {device} runs the standard ONNX domain and '{CUSTOM_DOMAIN}' only"


def gpu_support(node: onnx.NodeProto, types: ValueTypes) -> str | None:
    """The gpu runs every standard op and the custom ops (CUDA kernels later; onnxruntime today)."""
    return _library_domains(node, "gpu")


def cpu_support(node: onnx.NodeProto, types: ValueTypes) -> str | None:
    """The cpu is the fallback: everything our library and onnxruntime run."""
    return _library_domains(node, "cpu")


def _first_dynamic_tensor(node: onnx.NodeProto, types: ValueTypes) -> str | None:
    """Why one of the node's tensors has no fully static shape, naming the tensor; None when all do."""
    for role, names in (("input", node.input), ("output", node.output)):
        for name in filter(None, names):
            shape = types.shape(name)
            if shape is None:
                return f"{role} '{name}' has an unknown shape"
            dynamic = [d for d in shape if not isinstance(d, int)]
            if dynamic:
                dims = ", ".join(str(d) if d is not None else "?" for d in shape)
                return f"{role} '{name}' has the non-static dim {dynamic[0] or '?'} (shape [{dims}])"
    return None


def nna_support(static_shapes: bool = True) -> Predicate:
    """The nna runs dense float compute from `NNA_OPS`, with static shapes when `static_shapes`
    (accelerator compilers plan memory ahead). It cannot build hash tables nor compute on indices."""

    def supports(node: onnx.NodeProto, types: ValueTypes) -> str | None:
        if node.domain not in STANDARD_DOMAINS or node.op_type not in NNA_OPS:
            return f"{op_label(node)} is not in the nna capability table"
        for name in filter(None, node.output):
            elem_type = types.elem_type(name)
            if elem_type is None:
                return f"output '{name}' has an unknown element type; the nna computes on float tensors"
            if elem_type not in NNA_ELEM_TYPES:
                type_name = TensorProto.DataType.Name(elem_type).lower()
                return f"the nna computes on float tensors; this node outputs {type_name} ('{name}')"
        if static_shapes:
            dynamic = _first_dynamic_tensor(node, types)
            if dynamic:
                return f"{dynamic}; the nna needs static shapes"
        return None

    return supports


def device_table(static_shapes: bool = True) -> dict[str, Predicate]:
    """The built-in devices and their predicates."""
    return {"nna": nna_support(static_shapes), "gpu": gpu_support, "cpu": cpu_support}
