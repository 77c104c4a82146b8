"""Hostile models and hostile inputs: each one gets exactly the error message written here, never a crash,
a hang, a traceback from inside onnx/graphsurgeon, or silently wrong numbers.

* at lowering (`sparse_lower.lower`): malformed graphs, attributes of the wrong ONNX type or value,
  opset and IR versions sparse_lower cannot take — the message names the node and the fix;
* at import (`sparse_lower.import_model`): foreign-format files with missing or contradictory attributes;
* at run time (onnxruntime with our library): coords out of range, duplicated, of the wrong dtype or
  width, features that do not pair with them — the message is our kernel's (naming the op) or, for feeds
  that contradict the declared inputs, onnxruntime's own (naming the input);
* on the command line: the same refusals as one error line and exit status 2;
* NaN/Inf features propagate exactly as onnxruntime's dense Conv propagates them (the oracle of
  docs/source_ops.md): NaN positions identical, infinities identical, finite values close.

tests/test_errors.py holds the first, fragment-level refusals; the cases here are other defects, each
compared against its whole message.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import sparse_lower
from foreign_graphs import one_conv, scatter_model
from helpers import SUBM, model_with
from oracle import densify, dense_oracle, gather_sites, oracle_active_coords, random_sparse, sparse_node_model
from sparse_lower import SparseLowerError
from sparse_lower.cli.main import main
from sparse_lower.importers import import_model

VALIDATE = " (step 1 of 4: checking the source model)"
LOWER_GPU = " (step 2 of 4: lowering for the gpu target)"
STRIDED = {"kernel_shape": [2, 2], "strides": [2, 2], "spatial_shape": [8, 8]}
DANGLING = "is produced by no node and is neither a graph input nor an initializer"
INVALID_ARGUMENT = ort.capi.onnxruntime_pybind11_state.InvalidArgument


# -- building hostile models ------------------------------------------------------------------------

def conv(op_type="SubmanifoldConv", attrs=SUBM, target=False):
    """The single-node model of test_errors: node 'bad_node', inputs features [N, 3] and coords [N, 3],
    initializers W and B, outputs out_features and out_coords."""
    return model_with(op_type, attrs, target=target)


def with_initializer(model, name, value):
    index = next(i for i, t in enumerate(model.graph.initializer) if t.name == name)
    model.graph.initializer[index].CopyFrom(numpy_helper.from_array(value, name))
    return model


def without_initializer(model, name):
    index = next(i for i, t in enumerate(model.graph.initializer) if t.name == name)
    return model.graph.initializer.pop(index)


def with_input(model, value_info):
    """Replace the graph input of the same name."""
    index = next(i for i, v in enumerate(model.graph.input) if v.name == value_info.name)
    model.graph.input[index].CopyFrom(value_info)
    return model


def with_attribute(model, name, value, node=0, **kwargs):
    """Replace one attribute of a node (remove it where `value` is None)."""
    attrs = model.graph.node[node].attribute
    for old in [a for a in attrs if a.name == name]:
        attrs.remove(old)
    if value is not None:
        attrs.append(helper.make_attribute(name, value, **kwargs))
    return model


def with_nodes(model, *nodes, first=False):
    """Add nodes after (or, `first`, before) the existing ones."""
    at = 0 if first else len(model.graph.node)
    for offset, node in enumerate(nodes):
        model.graph.node.insert(at + offset, node)
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


def bias_as_graph_input(model):
    bias = without_initializer(model, "B")
    model.graph.input.append(helper.make_tensor_value_info("B", TensorProto.FLOAT, list(bias.dims)))
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


def to_dense_model(**attrs):
    """ToDense 'out' of features [N, 2] and coords [N, 3] into Y."""
    node = helper.make_node("ToDense", ["features", "coords"], ["Y"], name="out", domain="sparse", **attrs)
    graph = helper.make_graph([node], "to_dense",
                              [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 2]),
                               helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 3])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("sparse", 1)],
                             ir_version=10)


def dense_boundary_model(x_shape, rng, cout=3):
    """X [B, C, *S] → ToSparse 'in' → SubmanifoldConv 'conv' (3×…×3) → ToDense 'out' → Y, and (W, B)."""
    batch, cin, spatial = x_shape[0], x_shape[1], list(x_shape[2:])
    W = (rng.standard_normal((cout, cin, *[3] * len(spatial))) / 3).astype(np.float32)
    B = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("ToSparse", ["X"], ["f", "c"], name="in", domain="sparse"),
             helper.make_node("SubmanifoldConv", ["f", "c", "W", "B"], ["g", "d"], name="conv", domain="sparse",
                              kernel_shape=[3] * len(spatial), spatial_shape=spatial),
             helper.make_node("ToDense", ["g", "d"], ["Y"], name="out", domain="sparse", spatial_shape=spatial,
                              batch_size=batch)]
    graph = helper.make_graph(nodes, "dense_boundary", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                                                       list(x_shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, cout, *spatial])],
                              [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("sparse", 1)],
                              ir_version=10)
    return model, (W, B)


def cycle_model():
    """bad_node reads the Relu of its own output as its features."""
    return with_nodes(renamed_input(conv(), 0, "looped"),
                      helper.make_node("Relu", ["out_features"], ["looped"], name="relu"))


# -- at lowering ------------------------------------------------------------------------------------

def refused(model, **options) -> str:
    with pytest.raises(SparseLowerError) as info:
        sparse_lower.lower(model, **options)
    return str(info.value)


MALFORMED = {
    "weights initializer absent": (
        lambda: without_weights(conv()),
        f"node 'bad_node': input 'W' {DANGLING} (fix: add 'W' as an initializer or a graph input, or connect "
        f"the node that computes it)" + VALIDATE),
    "dangling input of a standard node": (
        lambda: with_output(with_nodes(conv(), helper.make_node("Add", ["out_features", "skip"], ["sum"],
                                                                name="residual")), "sum"),
        f"node 'residual': input 'skip' {DANGLING} (fix: add 'skip' as an initializer or a graph input, or "
        f"connect the node that computes it)" + VALIDATE),
    "weights of rank 3 for a 2D conv": (
        lambda: with_initializer(conv(), "W", np.zeros((4, 3, 3), np.float32)),
        "node 'bad_node': weights of shape [4, 3, 3] for a 2D conv (fix: give weights of rank 4 in the ONNX Conv "
        "layout)" + VALIDATE),
    "bias of rank 2": (
        lambda: with_initializer(conv(), "B", np.zeros((1, 4), np.float32)),
        "node 'bad_node': bias of shape [1, 4], expected [4] (fix: give a bias of shape [4] or none)" + VALIDATE),
    "features of rank 3": (
        lambda: with_input(conv(), helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 3, 1])),
        "node 'bad_node': features 'features' have rank 3 (fix: feed features as [N, C])" + VALIDATE),
    "float64 features": (
        lambda: with_input(conv(), helper.make_tensor_value_info("features", TensorProto.DOUBLE, ["N", 3])),
        "node 'bad_node': features 'features' are float64 (fix: feed float32 (or float16) features)" + VALIDATE),
    "target_coords of the wrong width": (
        lambda: with_input(conv("SparseDeconv", STRIDED, target=True),
                           helper.make_tensor_value_info("target_coords", TensorProto.INT64, ["M", 4])),
        "node 'bad_node': target_coords 'target_coords' have 4 columns, expected 3 (fix: feed target_coords as "
        "[N, 3] (batch, then 2 spatial indices))" + VALIDATE),
    "int64 weights (a quantised layer)": (
        lambda: with_initializer(conv(), "W", np.ones((4, 3, 3, 3), np.int64)),
        "node 'bad_node': the weights 'W' are int64 (fix: store float32 weights (dequantise integer weights "
        "first))" + VALIDATE),
    "weights computed by a node": (
        lambda: weights_from_a_node(conv()),
        "node 'bad_node': the weights 'W' are computed at run time (fix: store the weights as an initializer or a "
        "Constant node (the lowering re-lays them out at compile time))" + VALIDATE),
    "bias fed as a graph input": (
        lambda: bias_as_graph_input(conv()),
        "node 'bad_node': the bias 'B' are computed at run time (fix: store the bias as an initializer or a "
        "Constant node (the lowering re-lays them out at compile time))" + VALIDATE),
    "cycle through a standard node": (
        cycle_model,
        "node 'bad_node': the graph has a cycle: bad_node -> relu -> bad_node (fix: break the cycle (a recurrence "
        "needs a Loop or Scan node))" + VALIDATE),
    "duplicate node names": (
        lambda: with_output(with_nodes(conv(), helper.make_node("Relu", ["out_features"], ["r"], name="bad_node")),
                            "r"),
        "node 'bad_node': two nodes share this name (fix: give every node a unique name)" + VALIDATE),
    "two producers of one output name": (
        lambda: with_nodes(conv(), helper.make_node("Relu", ["features"], ["out_features"], name="relu")),
        "node 'relu': output 'out_features' is also an output of node 'bad_node' (fix: rename one of them: every "
        "tensor has exactly one producer)" + VALIDATE),
    "node output shadowing a graph input": (
        lambda: with_nodes(conv(), helper.make_node("Relu", ["features"], ["coords"], name="relu"), first=True),
        "node 'relu': output 'coords' has the name of a graph input or initializer (fix: rename the output: every "
        "tensor has exactly one producer)" + VALIDATE),
    "graph output nothing produces": (
        lambda: unproduced_graph_output(conv()),
        "graph output 'ghost' is produced by no node (fix: remove it from the graph outputs or connect the node "
        "that computes it)" + VALIDATE),
    "required coords input left empty": (
        lambda: renamed_input(conv(), 1, ""),
        "node 'bad_node': the required input 1 (coords) is empty (fix: connect the coords to input 1)" + VALIDATE),
    "too many inputs": (
        lambda: with_extra_inputs(conv(), "coords", "coords"),
        "node 'bad_node': SubmanifoldConv takes 3–4 inputs and 2 outputs, got 6 and 2 (fix: see docs/source_ops.md)"
        + VALIDATE),
    "domain the model does not import": (
        lambda: in_domain(conv(), "Sparse"),
        "node 'bad_node': op 'Sparse::SubmanifoldConv' is in a domain the model does not import (fix: add an opset "
        "import for 'Sparse', or correct the domain (the source ops are in 'sparse'))" + VALIDATE),
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
        lambda: with_attribute(conv(), "kernel_shape", 3.0),
        "node 'bad_node': attribute 'kernel_shape' is of type FLOAT, expected INTS (fix: write kernel_shape as a "
        "list of ints)" + VALIDATE),
    "kernel_shape as floats": (
        lambda: with_attribute(conv(), "kernel_shape", [3.5, 3.0]),
        "node 'bad_node': attribute 'kernel_shape' is of type FLOATS, expected INTS (fix: write kernel_shape as a "
        "list of ints)" + VALIDATE),
    "kernel_shape as a string": (
        lambda: with_attribute(conv(), "kernel_shape", "3,3"),
        "node 'bad_node': attribute 'kernel_shape' is of type STRING, expected INTS (fix: write kernel_shape as a "
        "list of ints)" + VALIDATE),
    "spatial_shape as a tensor": (
        lambda: with_attribute(conv(), "spatial_shape", numpy_helper.from_array(np.array([8, 8]))),
        "node 'bad_node': attribute 'spatial_shape' is of type TENSOR, expected INTS (fix: write spatial_shape as "
        "a list of ints)" + VALIDATE),
    "group as a list": (
        lambda: with_attribute(conv(), "group", [1]),
        "node 'bad_node': attribute 'group' is of type INTS, expected INT (fix: write group as an int)" + VALIDATE),
    "empty kernel_shape": (
        lambda: with_attribute(conv(), "kernel_shape", [], attr_type=onnx.AttributeProto.INTS),
        "node 'bad_node': attribute 'kernel_shape' is an empty list (fix: give kernel_shape one value per spatial "
        "dimension, or leave it out)" + VALIDATE),
    # wrong values
    "zero kernel": (
        lambda: conv(attrs={**SUBM, "kernel_shape": [0, 3]}),
        "node 'bad_node': kernel_shape=[0, 3] has a value below 1 (fix: use values >= 1)" + VALIDATE),
    "negative strides": (
        lambda: conv("SparseConv", {**STRIDED, "strides": [-2, 2]}),
        "node 'bad_node': strides=[-2, 2] has a value below 1 (fix: use values >= 1)" + VALIDATE),
    "negative pads": (
        lambda: conv("SparseConv", {**STRIDED, "pads": [-1, 0, 0, 0]}),
        "node 'bad_node': pads=[-1, 0, 0, 0] has a value below 0 (fix: use values >= 0)" + VALIDATE),
    "output_padding not below the stride": (
        lambda: conv("SparseDeconv", {**STRIDED, "output_padding": [2, 0]}),
        "node 'bad_node': output_padding=[2, 0] must be smaller than the stride or the dilation (fix: reduce "
        "output_padding (ONNX ConvTranspose rule))" + VALIDATE),
    "four spatial dimensions": (
        lambda: with_attribute(with_attribute(conv(), "kernel_shape", [3, 3, 3, 3]), "spatial_shape", [8, 8, 8, 8]),
        "node 'bad_node': 4 spatial dimensions are not supported (fix: use 1, 2 or 3 dimensions)" + VALIDATE),
    "ToDense spatial_shape of four dimensions": (
        lambda: to_dense_model(spatial_shape=[4, 4, 4, 4], batch_size=1),
        "node 'out': spatial_shape=[4, 4, 4, 4] is invalid (fix: give 1 to 3 extents >= 1)" + VALIDATE),
    "grid larger than int64 can number": (
        lambda: conv(attrs={**SUBM, "spatial_shape": [2**62, 2**62]}),
        "node 'bad_node': the spatial_shape [4611686018427387904, 4611686018427387904] has "
        "21267647932558653966460912964485513216 sites, more than int64 can number (fix: use a grid of at most "
        "2**63 - 1 sites)" + VALIDATE),
}


@pytest.mark.parametrize("case", ATTRIBUTES)
def test_attributes_of_the_wrong_type_or_value_are_refused(case):
    build, message = ATTRIBUTES[case]
    assert refused(build()) == message


NEWEST_OPSET = onnx.defs.onnx_opset_version()

VERSIONS = {
    "sparse domain version 2": (
        lambda: with_opsets(conv(), default=17, sparse=2), "gpu",
        "the model imports domain 'sparse' version 2 (fix: sparse_lower implements version 1 of the sparse ops)"
        + VALIDATE),
    "default opset too old for the nna ops": (
        lambda: with_opsets(conv(), default=15, sparse=1), "nna",
        "the model imports ONNX opset 15; the nna lowering emits opset-16 ops (fix: convert the model with "
        "onnx.version_converter first) (step 2 of 4: lowering for the nna target)"),
    "default opset newer than onnx knows": (
        lambda: with_opsets(conv(), default=99, sparse=1), "gpu",
        f"the model imports ONNX opset 99, newer than the newest that onnx {onnx.__version__} knows "
        f"({NEWEST_OPSET}) (fix: export the model at opset {NEWEST_OPSET} or older)" + LOWER_GPU),
    "IR version newer than onnx reads": (
        lambda: with_ir_version(conv(), 99), "gpu",
        f"the model has IR version 99; onnx {onnx.__version__} reads IR versions 3 to {onnx.IR_VERSION} (fix: stamp "
        f"the IR version of the onnx release that wrote the model (onnx.helper.make_model does))" + VALIDATE),
    "IR version unset": (
        lambda: with_ir_version(conv(), 0), "gpu",
        f"the model has IR version 0; onnx {onnx.__version__} reads IR versions 3 to {onnx.IR_VERSION} (fix: stamp "
        f"the IR version of the onnx release that wrote the model (onnx.helper.make_model does))" + VALIDATE),
}


@pytest.mark.parametrize("case", VERSIONS)
def test_versions_sparse_lower_cannot_take_are_refused(case):
    build, target, message = VERSIONS[case]
    assert refused(build(), target=target) == message


def test_an_ir_version_newer_than_onnxruntime_reads_is_capped_and_runs(rng):
    """onnxruntime 1.21, the oldest runtime supported, reads IR <= 10: a model of IR 13 (onnx knows it)
    is lowered to IR 10 rather than refused, and runs."""
    lowered = sparse_lower.lower(with_ir_version(conv(), 13))
    assert lowered.ir_version == 10
    features, coords = random_sparse(rng, 1, 3, (8, 8), count=10)
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


# -- at run time -----------------------------------------------------------------------------------

def session(model, **options):
    return sparse_lower.create_session(sparse_lower.lower(model, **options))


def run_error(session, feeds) -> str:
    """The whole message of the run's failure (onnxruntime refuses bad feeds as InvalidArgument)."""
    with pytest.raises(INVALID_ARGUMENT) as info:
        session.run(None, feeds)
    return str(info.value)


def kernel_message(session, feeds) -> str:
    """The message our kernel returned: what follows onnxruntime's 'Status Message: ' prefix."""
    return run_error(session, feeds).split("Status Message: ", 1)[1]


def onnxruntime_message(text):
    return f"[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : {text}"


def changed(array, index, value):
    array = array.copy()
    array[index] = value
    return array


def symbolic_channels(model):
    """Declare the features [N, "C"]: the channel count is known to the lowering, not to the model."""
    dim = model.graph.input[0].type.tensor_type.shape.dim[1]
    dim.Clear()
    dim.dim_param = "C"
    return model


def coords_cast_in_the_graph(model):
    """coords32 int32 [N, "D"] → Cast → coords, as the lowering's advice for int32 coords suggests."""
    with_input(model, helper.make_tensor_value_info("coords", TensorProto.INT32, ["N", "D"]))
    model.graph.input[1].name = "coords32"
    return with_nodes(model, helper.make_node("Cast", ["coords32"], ["coords"], name="cast", to=TensorProto.INT64),
                      first=True)


@pytest.fixture
def sparse_input(rng):
    """10 unique active sites of one batch on the 8×8 grid, with 3 channels."""
    return random_sparse(rng, 1, 3, (8, 8), count=10)


def test_int32_coords_are_refused_by_the_declared_type(sparse_input):
    features, coords = sparse_input
    assert run_error(session(conv()), {"features": features, "coords": coords.astype(np.int32)}) == \
        onnxruntime_message("Unexpected input data type. Actual: (tensor(int32)) , expected: (tensor(int64))")


def test_float_coords_are_refused_by_the_declared_type_on_the_nna(sparse_input):
    features, coords = sparse_input
    assert run_error(session(conv(), target="nna"), {"features": features, "coords": coords.astype(np.float32)}) == \
        onnxruntime_message("Unexpected input data type. Actual: (tensor(float)) , expected: (tensor(int64))")


def test_coords_wider_than_declared_are_refused_by_name(sparse_input):
    features, coords = sparse_input
    wide = np.concatenate([coords, coords[:, :1]], axis=1)
    assert run_error(session(conv()), {"features": features, "coords": wide}) == onnxruntime_message(
        "Got invalid dimensions for input: coords for the following indices\n index: 1 Got: 4 Expected: 3\n Please "
        "fix either the inputs/outputs or the model.")


@pytest.mark.parametrize("target", ["gpu", "nna"])
def test_features_wider_than_the_weights_are_refused_by_name(target, sparse_input):
    """Formerly a MatMul (gpu) or Reshape (nna) failure deep inside the lowered graph: the lowering now
    declares the channel count it knows, and onnxruntime names the input."""
    _, coords = sparse_input
    assert run_error(session(symbolic_channels(conv()), target=target),
                     {"features": np.ones((10, 5), np.float32), "coords": coords}) == onnxruntime_message(
        "Got invalid dimensions for input: features for the following indices\n index: 1 Got: 5 Expected: 3\n Please "
        "fix either the inputs/outputs or the model.")


def test_coords_of_the_wrong_width_computed_in_the_graph_fail_in_the_kernel(sparse_input):
    features, coords = sparse_input
    wide = np.concatenate([coords, coords[:, :1]], axis=1).astype(np.int32)
    assert kernel_message(session(coords_cast_in_the_graph(conv())), {"features": features, "coords32": wide}) == \
        "SubmanifoldMap: coords must have shape [N, 3] (batch and 2 spatial columns), got [10, 4]"


def test_feature_rows_must_pair_with_the_coords_on_the_nna(sparse_input):
    features, coords = sparse_input
    assert kernel_message(session(conv(), target="nna"), {"features": features[:7], "coords": coords}) == \
        "PairRows: features have 7 rows but coords have 10: features and coords must pair row by row"


def test_a_batch_index_overflowing_the_linear_sites_is_refused(sparse_input):
    features, coords = sparse_input
    assert kernel_message(session(conv()), {"features": features, "coords": changed(coords, (1, 0), 2**62)}) == \
        "SubmanifoldMap: row 1 of coords has batch 4611686018427387904, too large for linear sites to fit in int64"


@pytest.mark.parametrize("target", ["nna", "hybrid"])
def test_a_negative_batch_is_refused(target, sparse_input):
    features, coords = sparse_input
    message = kernel_message(session(conv("SparseDeconv", STRIDED), target=target),
                             {"features": features, "coords": changed(coords, (0, 0), -1)})
    assert message == "TransposedMap: row 0 of coords has a negative batch -1"


def test_a_coordinate_outside_the_grid_is_refused_on_the_nna(sparse_input):
    features, coords = sparse_input
    outside = changed(coords, (3, 2), 8)
    assert kernel_message(session(conv("SparseConv", STRIDED), target="nna"), {"features": features,
                                                                                "coords": outside}) == \
        f"StridedMap: coordinate (0, {outside[3, 1]}, 8) of row 3 of coords is outside the grid [8, 8]"


@pytest.mark.parametrize("target, targets, message", [
    ("gpu", [[0, 1, 1], [0, 1, 1]], "TargetMap: rows 0 and 1 of target_coords are the same coordinate (0, 1, 1)"),
    ("nna", [[0, -1, 1]], "TargetMap: coordinate (0, -1, 1) of row 0 of target_coords is outside the output grid "
                          "[8, 8]"),
], ids=["duplicated on the gpu", "negative on the nna"])
def test_target_coords_duplicated_or_negative_are_refused(target, targets, message, rng):
    features, coords = random_sparse(rng, 1, 3, (4, 4), count=5)
    attrs = {**STRIDED, "spatial_shape": [4, 4]}
    feeds = {"features": features, "coords": coords, "target_coords": np.array(targets, np.int64)}
    assert kernel_message(session(conv("SparseDeconv", attrs, target=True), target=target), feeds) == message


def test_more_rows_than_max_active_are_refused(sparse_input):
    features, coords = sparse_input
    assert kernel_message(session(conv(), target="nna", max_active=4), {"features": features, "coords": coords}) == \
        "CapacityPads: x has 10 rows, more than the capacity 4 (max_active); raise max_active to at least 10"


@pytest.mark.parametrize("features, coords, message", [
    (np.ones((3, 2), np.float32), [[0, 1, 1], [0, 1, 2]],
     "PairRows: features have 3 rows but coords have 2: features and coords must pair row by row"),
    (np.ones((2, 2), np.float32), [[0, 1, 1], [0, 1, 1]],
     "SiteIndex: rows 0 and 1 of coords are the same coordinate (0, 1, 1)"),
], ids=["rows not pairing", "duplicated coords"])
def test_to_dense_refuses_feeds_that_are_not_a_sparse_tensor(features, coords, message):
    model = to_dense_model(spatial_shape=[4, 4], batch_size=1)
    assert kernel_message(session(model), {"features": features, "coords": np.array(coords, np.int64)}) == message


def test_to_sparse_refuses_an_input_of_another_rank_by_name(rng):
    model, _ = dense_boundary_model((1, 2, 4, 4), rng)
    assert run_error(session(model), {"X": np.ones((1, 2, 4), np.float32)}) == onnxruntime_message(
        "Invalid rank for input: X Got: 3 Expected: 4 Please fix either the inputs/outputs or the model.")


# -- on the command line -------------------------------------------------------------------------------

@pytest.mark.parametrize("build, message", [
    (cycle_model, "node 'bad_node': the graph has a cycle: bad_node -> relu -> bad_node (fix: break the cycle (a "
                  "recurrence needs a Loop or Scan node))" + VALIDATE),
    (lambda: foreign(one_conv(kernel_size=[0, 3, 3])),
     f"{CONV}: attribute 'kernel_size'=[0, 3, 3] has a value below 1 (fix: use values >= 1)"),
], ids=["section-3 model with a cycle", "NVIDIA file with a zero kernel"])
def test_convert_reports_a_hostile_file_in_one_line(build, message, tmp_path, capsys):
    path = tmp_path / "hostile.onnx"
    onnx.save(build(), path)
    assert main(["convert", str(path), "-o", str(tmp_path / "out.onnx")]) == 2
    assert capsys.readouterr().err == f"sparse-lower convert: error: {message}\n"


def test_convert_reports_a_missing_file(tmp_path, capsys):
    path = tmp_path / "absent.onnx"
    assert main(["convert", str(path), "-o", str(tmp_path / "out.onnx")]) == 2
    assert capsys.readouterr().err == (f"sparse-lower convert: error: cannot read the model '{path}': [Errno 2] No "
                                       f"such file or directory: '{path}'\n")


# -- NaN and Inf ----------------------------------------------------------------------------------------

NON_FINITE_OPS = {
    "SubmanifoldConv": {"kernel_shape": [3, 3], "spatial_shape": [6, 6]},
    "SparseConv": {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "spatial_shape": [6, 6]},
    "SparseDeconv": {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1],
                     "spatial_shape": [6, 6]},
}
COMPUTE_FORMS = [
    pytest.param("gpu", {"strategy": "unfold"}, id="gpu-unfold"),
    pytest.param("gpu", {"strategy": "rulebook"}, id="gpu-rulebook"),
    pytest.param("gpu", {"strategy": "fused"}, id="gpu-fused"),
    pytest.param("nna", {"combine": "gather"}, id="nna-gather"),
    pytest.param("nna", {"combine": "scatter"}, id="nna-scatter"),
    pytest.param("nna", {"combine": "gather", "fuse_taps": True, "max_active": 200}, id="nna-fused-capacity"),
    pytest.param("hybrid", {}, id="hybrid"),
]


def assert_same_as_dense(got, want):
    """NaN at the same places, the same infinities, finite values close — and the case is not vacuous."""
    assert np.isnan(want).any() and np.isinf(want).any() and np.isfinite(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)  # equal infinities, NaN where NaN


@pytest.mark.parametrize("op_type", NON_FINITE_OPS)
@pytest.mark.parametrize("target, options", COMPUTE_FORMS)
def test_nan_and_inf_features_propagate_like_the_dense_conv(op_type, target, options, rng):
    attrs = NON_FINITE_OPS[op_type]
    model, (W, B) = sparse_node_model(op_type, attrs, 3, 4, 2, True, False, rng)
    features, coords = random_sparse(rng, 2, 3, (6, 6), count=20)
    features[2, 1], features[5, 0], features[7, 2] = np.nan, np.inf, -np.inf
    out_features, out_coords = session(model, target=target, **options).run(None, {"features": features,
                                                                                    "coords": coords})
    np.testing.assert_array_equal(out_coords, oracle_active_coords(op_type, attrs, coords, 2))
    dense = dense_oracle(op_type, attrs, densify(features, coords, 2, attrs["spatial_shape"]), W, B)
    assert_same_as_dense(out_features, gather_sites(dense, out_coords))


@pytest.mark.parametrize("op_type", NON_FINITE_OPS)
def test_the_matmul_combine_spreads_nan_over_the_layer_as_documented(op_type, rng):
    """The documented limit of patent method 1 (lowering/nna/compute.py): its product with the 0/1
    scatter matrices multiplies every partial by zeros too, and 0·NaN = 0·Inf = NaN, so one non-finite
    feature makes the whole layer NaN. No op of the accelerator's table selects without multiplying;
    gather and scatter (above) are exact."""
    model, _ = sparse_node_model(op_type, NON_FINITE_OPS[op_type], 3, 4, 2, True, False, rng)
    features, coords = random_sparse(rng, 2, 3, (6, 6), count=20)
    features[5, 0] = np.inf
    out_features, _ = session(model, target="nna", combine="matmul").run(None, {"features": features, "coords": coords})
    assert out_features.size and np.isnan(out_features).all()


@pytest.mark.parametrize("target", ["gpu", "nna"])
def test_nan_and_inf_in_a_dense_input_propagate_through_to_sparse_and_to_dense(target, rng):
    """The dense-format path: ToSparse counts a NaN site as active (it is non-zero), the conv unfolds
    straight from X on the gpu, and ToDense writes zeros only where no site is active."""
    x = np.where(rng.random((2, 2, 5, 5)) < 0.3, rng.standard_normal((2, 2, 5, 5)), 0).astype(np.float32)
    x[0, 1, 2, 2], x[1, 0, 1, 3], x[1, 1, 4, 0] = np.nan, np.inf, -np.inf
    model, (W, B) = dense_boundary_model(x.shape, rng)
    (y,) = session(model, target=target).run(None, {"X": x})
    active = (x != 0).any(axis=1, keepdims=True)
    attrs = {"kernel_shape": [3, 3], "spatial_shape": [5, 5]}
    assert_same_as_dense(y, np.where(active, dense_oracle("SubmanifoldConv", attrs, x, W, B), 0))
