"""Models and options that sparse_lower refuses before anything runs. Each is compared against its whole
message, which names the node (or the option) and says what to change: never a crash, a traceback from
inside onnx/graphsurgeon, or a lowered model that computes something else.

* at lowering (`sparse_lower.lower`): options it does not have; malformed graphs and tensor declarations
  (dangling names, weights, bias, features and coords of the wrong shape or type); attributes of the wrong
  ONNX type or value; opset and IR versions it cannot take. The message ends with the pass manager's step;
* at import (`sparse_lower.import_model`): foreign-format files with missing or contradictory attributes;
* on the command line: the same refusals as one error line and exit status 2.

What a lowered model does with bad feeds at run time is tests/test_hostile.py's.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import sparse_lower
from foreign_graphs import one_conv, scatter_model
from helpers import STRIDED, SUBM, model_with, to_dense_model, with_input, with_nodes
from sparse_lower import SparseLowerError
from sparse_lower.cli.main import main
from sparse_lower.importers import import_model

VALIDATE = " (step 1 of 7: checking the source model)"
LOWER_GPU = " (step 4 of 7: lowering for the gpu target)"
DANGLING = "is produced by no node and is neither a graph input nor an initializer"


# -- building malformed models ----------------------------------------------------------------------

def with_initializer(model, name, value):
    index = next(i for i, t in enumerate(model.graph.initializer) if t.name == name)
    model.graph.initializer[index].CopyFrom(numpy_helper.from_array(value, name))
    return model


def without_initializer(model, name):
    index = next(i for i, t in enumerate(model.graph.initializer) if t.name == name)
    return model.graph.initializer.pop(index)


def with_attribute(model, name, value, node=0, **kwargs):
    """Replace one attribute of a node (remove it where `value` is None)."""
    attrs = model.graph.node[node].attribute
    for old in [a for a in attrs if a.name == name]:
        attrs.remove(old)
    if value is not None:
        attrs.append(helper.make_attribute(name, value, **kwargs))
    return model


def with_opsets(model, **versions):
    """Replace the opset imports; the default domain is spelled `default`."""
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid("" if d == "default" else d, v) for d, v in versions.items())
    return model


def with_ir_version(model, version):
    model.ir_version = version
    return model


def renamed_input(model, index, name):
    model.graph.node[0].input[index] = name
    return model


def weights_from_a_node(model):
    """W becomes the output of an Identity of the initializer (so not a constant of the graph)."""
    weights = without_initializer(model, "W")
    weights.name = "W_source"
    model.graph.initializer.append(weights)
    return with_nodes(model, helper.make_node("Identity", ["W_source"], ["W"], name="copy"), first=True)


def with_extra_inputs(model, *names):
    model.graph.node[0].input.extend(names)
    return model


def in_domain(model, domain):
    model.graph.node[0].domain = domain
    return model


def with_op_type(model, op_type):
    model.graph.node[0].op_type = op_type
    return model


def with_graph_input(model, value_info):
    model.graph.input.append(value_info)
    return model


def with_input_type(model, index, elem_type):
    model.graph.input[index].type.tensor_type.elem_type = elem_type
    return model


def without_output_shape(model):
    model.graph.output[0].type.tensor_type.ClearField("shape")
    return model


def without_weights(model):
    without_initializer(model, "W")
    return model


def as_graph_input(model, name):
    """The initializer `name` becomes a graph input of its shape: fed at run time."""
    tensor = without_initializer(model, name)
    model.graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(tensor.dims)))
    return model


def unproduced_graph_output(model):
    model.graph.output.append(helper.make_tensor_value_info("ghost", TensorProto.FLOAT, [1]))
    return model


def with_output(model, name):
    model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 4]))
    return model


def to_sparse_model(x_shape):
    """ToSparse 'in' of X into f, c."""
    node = helper.make_node("ToSparse", ["X"], ["f", "c"], name="in", domain="sparse")
    graph = helper.make_graph([node], "to_sparse", [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("f", TensorProto.FLOAT, ["N", x_shape[1]]),
                               helper.make_tensor_value_info("c", TensorProto.INT64, ["N", len(x_shape) - 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("sparse", 1)],
                             ir_version=10)


def cycle_model():
    """bad_node reads the Relu of its own output as its features."""
    return with_nodes(renamed_input(model_with(), 0, "looped"),
                      helper.make_node("Relu", ["out_features"], ["looped"], name="relu"))


# -- at lowering ------------------------------------------------------------------------------------


def refused(model, **options) -> str:
    with pytest.raises(SparseLowerError) as info:
        sparse_lower.lower(model, **options)
    return str(info.value)


MALFORMED = {
    "weights initializer absent": (
        lambda: without_weights(model_with()),
        f"node 'bad_node': input 'W' {DANGLING} (fix: add 'W' as an initializer or a graph input, or connect "
        f"the node that computes it)" + VALIDATE),
    "dangling input of a standard node": (
        lambda: with_output(with_nodes(model_with(), helper.make_node("Add", ["out_features", "skip"], ["sum"],
                                                                      name="residual")), "sum"),
        f"node 'residual': input 'skip' {DANGLING} (fix: add 'skip' as an initializer or a graph input, or "
        f"connect the node that computes it)" + VALIDATE),
    "weights of rank 3 for a 2D conv": (
        lambda: with_initializer(model_with(), "W", np.zeros((4, 3, 3), np.float32)),
        "node 'bad_node': weights of shape [4, 3, 3] for a 2D conv (fix: give weights of rank 4 in the ONNX Conv "
        "layout)" + VALIDATE),
    "bias of rank 2": (
        lambda: with_initializer(model_with(), "B", np.zeros((1, 4), np.float32)),
        "node 'bad_node': bias of shape [1, 4], expected [4] (fix: give a bias of shape [4] or none)" + VALIDATE),
    "weights of another kernel size": (
        lambda: with_initializer(model_with(), "W", np.zeros((4, 3, 5, 5), np.float32)),
        "node 'bad_node': weights of shape [4, 3, 5, 5] do not match kernel_shape [3, 3] (fix: give weights "
        "[4, 3, 3, 3] (Cout, Cin, *kernel))" + VALIDATE),
    # spconv's KRSC weights [Cout, *K, Cin], as a user exporting by hand has them: the fix is a transpose
    "weights in spconv's layout": (
        lambda: with_initializer(model_with(cin=5), "W", np.zeros((4, 3, 3, 5), np.float32)),
        "node 'bad_node': weights of shape [4, 3, 3, 5] are in spconv's layout [Cout, *kernel, Cin], not (Cout, "
        "Cin, *kernel) (fix: transpose them: np.moveaxis(w, -1, 1) gives [4, 5, 3, 3] (sparse_lower.export does "
        "this for spconv modules))" + VALIDATE),
    "deconv weights in spconv's layout": (
        lambda: with_initializer(model_with("SparseDeconv", {**SUBM, "strides": [2, 2]}, cin=5), "W",
                                 np.zeros((4, 3, 3, 5), np.float32)),
        "node 'bad_node': weights of shape [4, 3, 3, 5] are in spconv's layout [Cout, *kernel, Cin], not (Cin, "
        "Cout, *kernel) (fix: transpose them: np.moveaxis(w, -1, 0) gives [5, 4, 3, 3] (sparse_lower.export does "
        "this for spconv modules))" + VALIDATE),
    "features of more channels than the weights take": (
        lambda: with_input(model_with(), helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 5])),
        "node 'bad_node': features 'features' have 5 channels but the weights expect 3 (fix: make the weights' "
        "input channels match the features)" + VALIDATE),
    "features of rank 3": (
        lambda: with_input(model_with(), helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 3, 1])),
        "node 'bad_node': features 'features' have rank 3 (fix: feed features as [N, C])" + VALIDATE),
    "float64 features": (
        lambda: with_input(model_with(), helper.make_tensor_value_info("features", TensorProto.DOUBLE, ["N", 3])),
        "node 'bad_node': features 'features' are float64 (fix: feed float32 (or float16) features)" + VALIDATE),
    "target_coords of the wrong width": (
        lambda: with_input(model_with("SparseDeconv", STRIDED, target=True),
                           helper.make_tensor_value_info("target_coords", TensorProto.INT64, ["M", 4])),
        "node 'bad_node': target_coords 'target_coords' have 4 columns, expected 3 (fix: feed target_coords as "
        "[N, 3] (batch, then 2 spatial indices))" + VALIDATE),
    "int32 coords": (
        lambda: with_input(model_with(), helper.make_tensor_value_info("coords", TensorProto.INT32, ["N", 3])),
        "node 'bad_node': coords 'coords' are int32 (fix: feed int64 coords [N, 3] (insert a Cast to int64))"
        + VALIDATE),
    "coords of rank 3": (
        lambda: with_input(model_with(), helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 3, 1])),
        "node 'bad_node': coords 'coords' have rank 3 (fix: feed coords as [N, 3] (batch, then 2 spatial "
        "indices))" + VALIDATE),
    "coords of the wrong width": (
        lambda: with_input(model_with(), helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 4])),
        "node 'bad_node': coords 'coords' have 4 columns, expected 3 (fix: feed coords as [N, 3] (batch, then 2 "
        "spatial indices))" + VALIDATE),
    "int64 weights (a quantised layer)": (
        lambda: with_initializer(model_with(), "W", np.ones((4, 3, 3, 3), np.int64)),
        "node 'bad_node': the weights 'W' are int64 (fix: store float32 weights (dequantise integer weights "
        "first))" + VALIDATE),
    "weights computed by a node": (
        lambda: weights_from_a_node(model_with()),
        "node 'bad_node': the weights 'W' are computed at run time (fix: store the weights as an initializer or a "
        "Constant node (the lowering re-lays them out at compile time))" + VALIDATE),
    "weights fed as a graph input": (
        lambda: as_graph_input(model_with(), "W"),
        "node 'bad_node': the weights 'W' are computed at run time (fix: store the weights as an initializer or a "
        "Constant node (the lowering re-lays them out at compile time))" + VALIDATE),
    "bias fed as a graph input": (
        lambda: as_graph_input(model_with(), "B"),
        "node 'bad_node': the bias 'B' are computed at run time (fix: store the bias as an initializer or a "
        "Constant node (the lowering re-lays them out at compile time))" + VALIDATE),
    "cycle through a standard node": (
        cycle_model,
        "node 'bad_node': the graph has a cycle: bad_node -> relu -> bad_node (fix: break the cycle (a recurrence "
        "needs a Loop or Scan node))" + VALIDATE),
    "duplicate node names": (
        lambda: with_output(with_nodes(model_with(), helper.make_node("Relu", ["out_features"], ["r"],
                                                                      name="bad_node")), "r"),
        "node 'bad_node': two nodes share this name (fix: give every node a unique name)" + VALIDATE),
    "two producers of one output name": (
        lambda: with_nodes(model_with(), helper.make_node("Relu", ["features"], ["out_features"], name="relu")),
        "node 'relu': output 'out_features' is also an output of node 'bad_node' (fix: rename one of them: every "
        "tensor has exactly one producer)" + VALIDATE),
    "node output shadowing a graph input": (
        lambda: with_nodes(model_with(), helper.make_node("Relu", ["features"], ["coords"], name="relu"), first=True),
        "node 'relu': output 'coords' has the name of a graph input or initializer (fix: rename the output: every "
        "tensor has exactly one producer)" + VALIDATE),
    "graph output nothing produces": (
        lambda: unproduced_graph_output(model_with()),
        "graph output 'ghost' is produced by no node (fix: remove it from the graph outputs or connect the node "
        "that computes it)" + VALIDATE),
    "required coords input left empty": (
        lambda: renamed_input(model_with(), 1, ""),
        "node 'bad_node': the required input 1 (coords) is empty (fix: connect the coords to input 1)" + VALIDATE),
    "too many inputs": (
        lambda: with_extra_inputs(model_with(), "coords", "coords"),
        "node 'bad_node': SubmanifoldConv takes 3–4 inputs and 2 outputs, got 6 and 2 (fix: see docs/source_ops.md)"
        + VALIDATE),
    "domain the model does not import": (
        lambda: in_domain(model_with(), "Sparse"),
        "node 'bad_node': op 'Sparse::SubmanifoldConv' is in a domain the model does not import (fix: add an opset "
        "import for 'Sparse', or correct the domain (the source ops are in 'sparse'))" + VALIDATE),
    "unknown source op": (
        lambda: with_op_type(model_with(), "SparseAvgPool"),
        "node 'bad_node': unknown op 'sparse::SparseAvgPool' (fix: use one of SubmanifoldConv, SparseConv, "
        "SparseDeconv, ToSparse, ToDense, SparseMaxPool, Coalesce)" + VALIDATE),
    "ToSparse of a rank-2 tensor": (
        lambda: to_sparse_model([1, 4]),
        "node 'in': ToSparse input of rank 2 (fix: feed a dense [B, C, *S] tensor with 1 to 3 spatial "
        "dimensions)" + VALIDATE),
    "ToDense without batch_size": (
        lambda: to_dense_model(spatial_shape=[4, 4]),
        "node 'out': attribute 'batch_size' (int >= 1) is required (fix: set batch_size)" + VALIDATE),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_graphs_are_refused_naming_the_node(case):
    build, message = MALFORMED[case]
    assert refused(build()) == message


ATTRIBUTES = {
    # wrong ONNX types: a crash (TypeError), silent truncation, bytes read as ints, a crash (TensorProto)
    "kernel_shape as a float": (
        lambda: with_attribute(model_with(), "kernel_shape", 3.0),
        "node 'bad_node': attribute 'kernel_shape' is of type FLOAT, expected INTS (fix: write kernel_shape as a "
        "list of ints)" + VALIDATE),
    "kernel_shape as floats": (
        lambda: with_attribute(model_with(), "kernel_shape", [3.5, 3.0]),
        "node 'bad_node': attribute 'kernel_shape' is of type FLOATS, expected INTS (fix: write kernel_shape as a "
        "list of ints)" + VALIDATE),
    "kernel_shape as a string": (
        lambda: with_attribute(model_with(), "kernel_shape", "3,3"),
        "node 'bad_node': attribute 'kernel_shape' is of type STRING, expected INTS (fix: write kernel_shape as a "
        "list of ints)" + VALIDATE),
    "spatial_shape as a tensor": (
        lambda: with_attribute(model_with(), "spatial_shape", numpy_helper.from_array(np.array([8, 8]))),
        "node 'bad_node': attribute 'spatial_shape' is of type TENSOR, expected INTS (fix: write spatial_shape as "
        "a list of ints)" + VALIDATE),
    "group as a list": (
        lambda: with_attribute(model_with(), "group", [1]),
        "node 'bad_node': attribute 'group' is of type INTS, expected INT (fix: write group as an int)" + VALIDATE),
    "empty kernel_shape": (
        lambda: with_attribute(model_with(), "kernel_shape", [], attr_type=onnx.AttributeProto.INTS),
        "node 'bad_node': attribute 'kernel_shape' is an empty list (fix: give kernel_shape one value per spatial "
        "dimension, or leave it out)" + VALIDATE),
    # wrong values
    "group of 2": (
        lambda: model_with(attrs={**SUBM, "group": 2}),
        "node 'bad_node': group=2 is not supported (fix: use group=1 (split the layer per group))" + VALIDATE),
    "even kernel of a submanifold conv": (
        lambda: model_with(attrs={**SUBM, "kernel_shape": [2, 3]}),
        "node 'bad_node': SubmanifoldConv needs odd kernel sizes, got kernel_shape=[2, 3] (fix: use an odd kernel "
        "(a submanifold conv is centred on each active site))" + VALIDATE),
    "strided submanifold conv": (
        lambda: model_with(attrs={**SUBM, "strides": [2, 2]}),
        "node 'bad_node': SubmanifoldConv needs strides of 1, got strides=[2, 2] (fix: use SparseConv for a "
        "strided convolution)" + VALIDATE),
    "zero dilation": (
        lambda: model_with(attrs={**SUBM, "dilations": [0, 1]}),
        "node 'bad_node': dilations=[0, 1] has a value below 1 (fix: use values >= 1)" + VALIDATE),
    "unknown attribute": (
        lambda: model_with(attrs={**SUBM, "foo": 1}),
        "node 'bad_node': SubmanifoldConv has no attribute 'foo' (fix: remove it; SubmanifoldConv takes "
        "['dilations', 'group', 'kernel_shape', 'pads', 'spatial_shape', 'strides'])" + VALIDATE),
    "spatial_shape missing": (
        lambda: model_with(attrs={"kernel_shape": [3, 3]}),
        "node 'bad_node': attribute 'spatial_shape' is required (fix: set spatial_shape (length 2))" + VALIDATE),
    "spatial_shape of one value for a 2D conv": (
        lambda: model_with(attrs={**SUBM, "spatial_shape": [8]}),
        "node 'bad_node': attribute 'spatial_shape' has 1 values, expected 2 (fix: give 2 ints)" + VALIDATE),
    "kernel larger than the grid": (
        lambda: model_with("SparseConv", {"kernel_shape": [5, 5], "spatial_shape": [3, 8]}),
        "node 'bad_node': the output extent [-1, 4] has a dimension below 1 (input extent [3, 8]) (fix: reduce the "
        "kernel, pads or dilation, or enlarge spatial_shape)" + VALIDATE),
    "zero kernel": (
        lambda: model_with(attrs={**SUBM, "kernel_shape": [0, 3]}),
        "node 'bad_node': kernel_shape=[0, 3] has a value below 1 (fix: use values >= 1)" + VALIDATE),
    "negative strides": (
        lambda: model_with("SparseConv", {**STRIDED, "strides": [-2, 2]}),
        "node 'bad_node': strides=[-2, 2] has a value below 1 (fix: use values >= 1)" + VALIDATE),
    "negative pads": (
        lambda: model_with("SparseConv", {**STRIDED, "pads": [-1, 0, 0, 0]}),
        "node 'bad_node': pads=[-1, 0, 0, 0] has a value below 0 (fix: use values >= 0)" + VALIDATE),
    "output_padding not below the stride": (
        lambda: model_with("SparseDeconv", {**STRIDED, "output_padding": [2, 0]}),
        "node 'bad_node': output_padding=[2, 0] must be smaller than the stride or the dilation (fix: reduce "
        "output_padding (ONNX ConvTranspose rule))" + VALIDATE),
    "four spatial dimensions": (
        lambda: with_attribute(with_attribute(model_with(), "kernel_shape", [3, 3, 3, 3]), "spatial_shape",
                               [8, 8, 8, 8]),
        "node 'bad_node': 4 spatial dimensions are not supported (fix: use 1, 2 or 3 dimensions)" + VALIDATE),
    "ToDense spatial_shape of four dimensions": (
        lambda: to_dense_model(spatial_shape=[4, 4, 4, 4], batch_size=1),
        "node 'out': spatial_shape=[4, 4, 4, 4] is invalid (fix: give 1 to 3 extents >= 1)" + VALIDATE),
    "grid extent of 2^30": (
        lambda: model_with(attrs={**SUBM, "spatial_shape": [2**30, 8]}),
        "node 'bad_node': spatial_shape=[1073741824, 8] has a value of 2^30 or more (fix: use values below 2^30 "
        "(the custom ops compute coordinates in int64 from them))" + VALIDATE),
    "grid larger than int64 can number": (
        lambda: with_attribute(with_attribute(model_with(), "kernel_shape", [3, 3, 3]), "spatial_shape",
                               [2**29] * 3),
        "node 'bad_node': the spatial_shape [536870912, 536870912, 536870912] has "
        "154742504910672534362390528 sites, more than int64 can number (fix: use a grid of at most "
        "2**63 - 1 sites)" + VALIDATE),
}


@pytest.mark.parametrize("case", ATTRIBUTES)
def test_attributes_of_the_wrong_type_or_value_are_refused(case):
    build, message = ATTRIBUTES[case]
    assert refused(build()) == message


OPTIONS = {
    "target": ({"target": "tpu"}, "unknown target 'tpu' (fix: use one of gpu, nna, hybrid, portable)"),
    "strategy": ({"strategy": "fast"}, "unknown strategy 'fast' (fix: use one of auto, unfold, rulebook, fused)"),
    "combine": ({"combine": "sum"}, "unknown combine method 'sum' (fix: use one of gather, scatter, matmul, pairs, unfold)"),
    "max_active": ({"max_active": 0}, "max_active=0 is neither a positive int nor a sequence of them (fix: give "
                                      "None, an int >= 1, or one int >= 1 per level, e.g. [80000, 60000, 30000, "
                                      "15000])"),
}


@pytest.mark.parametrize("case", OPTIONS)
def test_options_sparse_lower_does_not_have_are_refused(case):
    options, message = OPTIONS[case]
    assert refused(model_with(), **options) == message


NEWEST_OPSET = onnx.defs.onnx_opset_version()

VERSIONS = {
    "sparse domain version 2": (
        lambda: with_opsets(model_with(), default=17, sparse=2), "gpu",
        "the model imports domain 'sparse' version 2 (fix: sparse_lower implements version 1 of the sparse ops)"
        + VALIDATE),
    "default opset too old for the nna ops": (
        lambda: with_opsets(model_with(), default=15, sparse=1), "nna",
        "the model imports ONNX opset 15; the nna lowering emits opset-16 ops (fix: convert the model with "
        "onnx.version_converter first) (step 4 of 7: lowering for the nna target)"),
    "default opset newer than onnx knows": (
        lambda: with_opsets(model_with(), default=99, sparse=1), "gpu",
        f"the model imports ONNX opset 99, newer than the newest that onnx {onnx.__version__} knows "
        f"({NEWEST_OPSET}) (fix: export the model at opset {NEWEST_OPSET} or older)" + LOWER_GPU),
    "IR version newer than onnx reads": (
        lambda: with_ir_version(model_with(), 99), "gpu",
        f"the model has IR version 99; onnx {onnx.__version__} reads IR versions 3 to {onnx.IR_VERSION} (fix: stamp "
        f"the IR version of the onnx release that wrote the model (onnx.helper.make_model does))" + VALIDATE),
    "IR version unset": (
        lambda: with_ir_version(model_with(), 0), "gpu",
        f"the model has IR version 0; onnx {onnx.__version__} reads IR versions 3 to {onnx.IR_VERSION} (fix: stamp "
        f"the IR version of the onnx release that wrote the model (onnx.helper.make_model does))" + VALIDATE),
}


@pytest.mark.parametrize("case", VERSIONS)
def test_versions_sparse_lower_cannot_take_are_refused(case):
    build, target, message = VERSIONS[case]
    assert refused(build(), target=target) == message


def test_an_ir_version_newer_than_onnxruntime_reads_is_capped_and_runs(sparse_input):
    """onnxruntime 1.21, the oldest runtime supported, reads IR <= 10: a model of IR 13 (onnx knows it)
    is lowered to IR 10 rather than refused, and runs."""
    lowered = sparse_lower.lower(with_ir_version(model_with(), 13))
    assert lowered.ir_version == 10
    features, coords = sparse_input
    out_features, out_coords = sparse_lower.create_session(lowered).run(None, {"features": features, "coords": coords})
    assert out_features.shape == (10, 4) and np.array_equal(out_coords, coords)


# -- at import ---------------------------------------------------------------------------------------


def foreign(built):
    """The model of a test_importers builder's (model, node name)."""
    return built[0]


def with_bias(model, value):
    return with_initializer(model, model.graph.node[0].input[2], value)


CONV = "node 'SparseConvolution_4'"
SCATTER = "node 'ScatterDense_6'"

FOREIGN = {
    "zero kernel_size": (
        lambda: foreign(one_conv(kernel_size=[0, 3, 3])),
        f"{CONV}: attribute 'kernel_size'=[0, 3, 3] has a value below 1 (fix: use values >= 1)"),
    "kernel_size as a tensor": (
        lambda: with_attribute(foreign(one_conv()), "kernel_size", numpy_helper.from_array(np.array([3, 3, 3]))),
        f"{CONV}: attribute 'kernel_size' is of type TENSOR (fix: write kernel_size as the exporter does (an "
        f"int, ints, a float or a string))"),
    "weight of rank 6": (
        lambda: with_initializer(foreign(one_conv()), "W_1", np.zeros((4, 3, 3, 3, 3, 3), np.float16)),
        f"{CONV}: weight of shape [4, 3, 3, 3, 3, 3] on a 3-D input (fix: give the weight as spconv 2.x KRSC "
        f"[Cout, k, k, k, Cin])"),
    "rulebook not a string": (
        lambda: foreign(one_conv(rulebook=5)),
        f"{CONV}: attribute 'rulebook'=5 is not a string (fix: write the spconv indice_key as a string)"),
    "bias of the wrong shape": (
        lambda: with_bias(foreign(one_conv()), np.zeros((2, 2), np.float16)),
        f"{CONV}: bias of shape [2, 2], expected [4] (fix: give a bias of 4 values or none)"),
    "ScatterDense without output_shape": (
        lambda: with_attribute(foreign(scatter_model()), "output_shape", None, node=1),
        f"{SCATTER}: attribute 'output_shape' is missing or not a list of ints (fix: write output_shape as a list "
        f"of ints)"),
    "ScatterDense grid as floats": (
        lambda: with_attribute(foreign(scatter_model()), "input_spatial_shape", [6.0, 7.0, 8.0], node=1),
        f"{SCATTER}: attribute 'input_spatial_shape' is missing or not a list of ints (fix: write "
        f"input_spatial_shape as a list of ints)"),
    "ScatterDense with a dynamic batch": (
        lambda: foreign(scatter_model(output_shape=[-1, 4, 6, 7, 8])),
        f"{SCATTER}: output_shape=[-1, 4, 6, 7, 8] is not static (fix: write the dense shape with a static batch "
        f"size)"),
    "AIMET indices declared float": (
        lambda: with_input_type(foreign(one_conv("aimet")), 0, TensorProto.FLOAT),
        f"{CONV}: the indices 'indices' are not integers (fix: declare them int32 or int64 [N, 4])"),
    "AIMET indices of the wrong width": (
        lambda: with_input(foreign(one_conv("aimet")),
                           helper.make_tensor_value_info("indices", TensorProto.INT32, ["N", 3])),
        f"{CONV}: the indices 'indices' are not [N, 4] (fix: declare them [N, 4] (batch, then 3 spatial indices))"),
    "NVIDIA graph already holding a 'coords' tensor": (
        lambda: with_graph_input(foreign(one_conv()), helper.make_tensor_value_info("coords", TensorProto.INT64,
                                                                                     ["N", 4])),
        f"{CONV}: the graph already has a tensor named 'coords' (fix: rename it: the imported model's coordinates "
        f"input is 'coords')"),
    "graph output without a shape": (
        lambda: without_output_shape(foreign(scatter_model())),
        "graph output 'dense_5' declares no shape (fix: declare its shape ([N, C] for sparse features; unknown "
        "dims may be symbolic))"),
}


@pytest.mark.parametrize("case", FOREIGN)
def test_foreign_files_with_missing_or_contradictory_attributes_are_refused(case):
    build, message = FOREIGN[case]
    with pytest.raises(SparseLowerError) as info:
        import_model(build())
    assert str(info.value) == message


# -- on the command line -------------------------------------------------------------------------------


@pytest.mark.parametrize("build, message", [
    (cycle_model, "node 'bad_node': the graph has a cycle: bad_node -> relu -> bad_node (fix: break the cycle (a "
                  "recurrence needs a Loop or Scan node))" + VALIDATE),
    (lambda: foreign(one_conv(kernel_size=[0, 3, 3])),
     f"{CONV}: attribute 'kernel_size'=[0, 3, 3] has a value below 1 (fix: use values >= 1)"),
], ids=["source-op model with a cycle", "NVIDIA file with a zero kernel"])
def test_convert_reports_a_hostile_file_in_one_line(build, message, tmp_path, capsys):
    path = tmp_path / "hostile.onnx"
    onnx.save(build(), path)
    assert main(["convert", str(path), "-o", str(tmp_path / "out.onnx")]) == 2
    assert capsys.readouterr().err == f"sparse-lower convert: error: {message}\n"


def test_convert_reports_a_missing_file(tmp_path, capsys):
    path = tmp_path / "absent.onnx"
    assert main(["convert", str(path), "-o", str(tmp_path / "out.onnx")]) == 2
    assert capsys.readouterr().err == (f"sparse-lower convert: error: cannot read the model '{path}': no such file "
                                       f"(fix: check the path)\n")

