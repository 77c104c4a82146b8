"""Code the test modules share: sessions and lowered runs, a portable model in onnxruntime, OpenVINO or
TVM (`runner`), small source models, and the command line in a process of its own. Test modules import shared code from here (or from oracle.py, custom_op_reference.py,
custom_op_runs.py, spconv_semantics.py, foreign_graphs.py, autoware_graphs.py, aimet_exports.py), never from
one another."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import sparse_lower
from oracle import IR_VERSION, OPSET_IMPORTS, sparse_node_model


TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(name: str):
    """The script tools/<name>.py as a module, imported as a script beside the others is (tools/ on the path
    while it loads: gpu_check imports portable_torch)."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(TOOLS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(TOOLS))
    return module


def session(model, threads=1, **settings) -> ort.InferenceSession:
    """A session of a lowered model on `threads` intra-op threads, with any other SessionOptions
    attributes in `settings`: with the library, or a plain one (no library) for a portable model."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    for name, value in settings.items():
        setattr(options, name, value)
    return sparse_lower.runtime.session_for(model, sess_options=options)


def run_lowered(model, feeds, threads=1, target="gpu", **options) -> dict:
    """Lower `model` for `target` (every pass checked), run it, and return its outputs by name, in the
    order of the graph outputs."""
    lowered = sparse_lower.lower(model, target=target, check_each_pass=True, **options)
    lowered_session = session(lowered, threads)
    names = [o.name for o in lowered_session.get_outputs()]
    return dict(zip(names, lowered_session.run(names, feeds)))


def chain_model(S=(6, 8), batch=2):
    """X → ToSparse → SubM → Relu → SubM → SubM (same table) → SparseConv s2 → ToDense."""
    rng = np.random.default_rng(3)
    W1 = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    W2 = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    W3 = rng.standard_normal((3, 4, 2, 2)).astype(np.float32)
    B1 = rng.standard_normal(4).astype(np.float32)
    S_down = [s // 2 for s in S]
    conv = {"kernel_shape": [2, 2], "strides": [2, 2], "spatial_shape": list(S)}
    nodes = [
        helper.make_node("ToSparse", ["X"], ["f0", "c0"], name="in", domain="sparse"),
        helper.make_node("SubmanifoldConv", ["f0", "c0", "W1", "B1"], ["f1", "c1"], name="subm1", domain="sparse",
                         kernel_shape=[3, 3], spatial_shape=list(S)),
        helper.make_node("Relu", ["f1"], ["r1"]),
        helper.make_node("SubmanifoldConv", ["r1", "c1", "W2"], ["f2", "c2"], name="subm2", domain="sparse",
                         kernel_shape=[3, 3], spatial_shape=list(S)),
        helper.make_node("SubmanifoldConv", ["f2", "c2", "W2"], ["f2b", "c2b"], name="subm3", domain="sparse",
                         kernel_shape=[3, 3], spatial_shape=list(S)),
        helper.make_node("SparseConv", ["f2b", "c2b", "W3"], ["f3", "c3"], name="down", domain="sparse", **conv),
        helper.make_node("ToDense", ["f3", "c3"], ["Y"], name="out", domain="sparse", spatial_shape=S_down,
                         batch_size=batch)]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, 2, *S])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, 3, *S_down])],
        [numpy_helper.from_array(v, k) for k, v in (("W1", W1), ("B1", B1), ("W2", W2), ("W3", W3))])
    return helper.make_model(graph, opset_imports=OPSET_IMPORTS, ir_version=IR_VERSION)


SUBM = {"kernel_shape": [3, 3], "spatial_shape": [8, 8]}
STRIDED = {"kernel_shape": [2, 2], "strides": [2, 2], "spatial_shape": [8, 8]}


def model_with(op_type="SubmanifoldConv", attrs=SUBM, cin=3, cout=4, ndim=2, target=False, rng=None):
    """The single-node model of the refusal tests: node 'bad_node', inputs features [N, cin] and coords
    [N, 1 + ndim] (and target_coords, with `target`), initializers W and B, outputs out_features and
    out_coords."""
    model, _ = sparse_node_model(op_type, attrs, cin, cout, ndim, True, target, rng or np.random.default_rng(0),
                                 name="bad_node")
    return model


def with_input(model, value_info):
    """Replace the graph input of the same name."""
    index = next(i for i, v in enumerate(model.graph.input) if v.name == value_info.name)
    model.graph.input[index].CopyFrom(value_info)
    return model


def with_nodes(model, *nodes, first=False):
    """Add nodes after (or, `first`, before) the existing ones."""
    at = 0 if first else len(model.graph.node)
    for offset, node in enumerate(nodes):
        model.graph.node.insert(at + offset, node)
    return model


def to_dense_model(**attrs):
    """ToDense 'out' of features [N, 2] and coords [N, 3] into Y."""
    node = helper.make_node("ToDense", ["features", "coords"], ["Y"], name="out", domain="sparse", **attrs)
    graph = helper.make_graph([node], "to_dense",
                              [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 2]),
                               helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 3])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=OPSET_IMPORTS, ir_version=IR_VERSION)


def sparse_lower_cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """The command line as a user runs it: its own process, its exit status, its stdout and stderr."""
    return subprocess.run([sys.executable, "-m", "sparse_lower.cli.main", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def runner(runtime: str, lowered: onnx.ModelProto, folder: Path):
    """A function of the feeds to the outputs by name, in `runtime`."""
    names = [o.name for o in lowered.graph.output]
    if runtime == "onnxruntime":
        plain = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
        return lambda inputs: dict(zip(names, plain.run(names, inputs)))
    if runtime == "openvino":
        ov = pytest.importorskip("openvino", reason="OpenVINO is not installed: pip install '.[openvino]'")
        onnx.save(lowered, folder / "portable.onnx")
        compiled = ov.Core().compile_model(str(folder / "portable.onnx"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        return lambda inputs: {n: compiled(inputs)[compiled.outputs[i]] for i, n in enumerate(names)}
    tvm = pytest.importorskip("tvm", reason="TVM is not installed: pip install '.[tvm]'")
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx
    module = relax.transform.LegalizeOps()(relax.transform.DecomposeOpsForInference()(
        from_onnx(lowered, keep_params_in_input=False)))
    machine = relax.VirtualMachine(relax.build(module, target=tvm.target.Target("llvm")), tvm.cpu())
    order = [v.name for v in lowered.graph.input]

    def run(inputs):
        results = machine["main"](*[tvm.runtime.tensor(inputs[name]) for name in order])
        results = [results] if hasattr(results, "numpy") else list(results)
        return dict(zip(names, (r.numpy() for r in results)))
    return run


def voxelnext_like(rng, channels=4):
    """A 3-D frame → SparseConv s2 (a) → SparseConv s2 (b); b's coords ×2 onto a's grid, the rows of both
    concatenated and coalesced (sum), z dropped and coalesced again (VoxelNeXt's bev_out), then a 2-D
    SparseConv k3 p1 (which dilates the sites), a strided max pooling and a SubmanifoldConv."""
    def weights(name, cout, cin, kernel):
        return numpy_helper.from_array(rng.standard_normal((cout, cin, *kernel)).astype(np.float32) * 0.3, name)

    inits = [weights("Wa", channels, 2, [3, 3, 3]), weights("Wb", channels, channels, [3, 3, 3]),
             weights("Wc", channels, channels, [3, 3]), weights("Wd", 3, channels, [3, 3]),
             numpy_helper.from_array(np.array([0, 2, 2, 2], np.int64), "scale"),
             numpy_helper.from_array(np.array([0, 2, 3], np.int64), "bev_columns")]
    conv = {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]}
    scale = numpy_helper.from_array(np.array([1, 2, 2, 2], np.int64), "scale")
    inits[4] = scale
    nodes = [
        helper.make_node("SparseConv", ["features", "coords", "Wa"], ["a", "a_coords"], domain="sparse", name="a",
                         spatial_shape=[9, 10, 11], **conv),
        helper.make_node("Relu", ["a"], ["a_relu"]),
        helper.make_node("SparseConv", ["a_relu", "a_coords", "Wb"], ["b", "b_coords"], domain="sparse", name="b",
                         spatial_shape=[5, 5, 6], **conv),
        helper.make_node("Mul", ["b_coords", "scale"], ["b_scaled"]),
        helper.make_node("Concat", ["a_relu", "b"], ["rows"], axis=0),
        helper.make_node("Concat", ["a_coords", "b_scaled"], ["rows_coords"], axis=0),
        helper.make_node("Coalesce", ["rows", "rows_coords"], ["merged", "merged_coords"], domain="sparse",
                         name="merge", spatial_shape=[5, 5, 6]),
        helper.make_node("Gather", ["merged_coords", "bev_columns"], ["bev_rows_coords"], axis=1),
        helper.make_node("Coalesce", ["merged", "bev_rows_coords"], ["bev", "bev_coords"], domain="sparse",
                         name="bev", spatial_shape=[5, 6]),
        helper.make_node("SparseConv", ["bev", "bev_coords", "Wc"], ["c", "c_coords"], domain="sparse", name="c",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], spatial_shape=[5, 6]),
        helper.make_node("SparseMaxPool", ["c", "c_coords"], ["p", "p_coords"], domain="sparse", name="pool",
                         kernel_shape=[2, 2], strides=[2, 2], spatial_shape=[5, 6]),
        helper.make_node("SubmanifoldConv", ["p", "p_coords", "Wd"], ["out_features", "out_coords"], domain="sparse",
                         name="d", kernel_shape=[3, 3], spatial_shape=[3, 3]),
    ]
    inits = [i for i in inits if i.name != "bev_columns"] + [numpy_helper.from_array(np.array([0, 2, 3], np.int64),
                                                                                       "bev_columns")]
    graph = helper.make_graph(nodes, "voxelnext_like", [
        helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 2]),
        helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 4])], [
        helper.make_tensor_value_info("out_features", TensorProto.FLOAT, ["M", 3]),
        helper.make_tensor_value_info("out_coords", TensorProto.INT64, ["M", 3])], inits)
    return helper.make_model(graph, opset_imports=OPSET_IMPORTS, ir_version=IR_VERSION)


def quantized(features, voxel=0.1, batch=0):
    """A real frame as the engines without a grid (MinkowskiEngine, TorchSparse) are fed by their users:
    (batch, floor(xyz / voxel)) of the points' metric x, y, z (signed, around the sensor), one row per site
    (the first: ME.utils.sparse_quantize and TorchSparse's sparse_quantize keep one)."""
    sites = np.floor(features[:, :3] / voxel).astype(np.int32)
    _, first = np.unique(sites, axis=0, return_index=True)
    first.sort()
    coords = np.concatenate([np.full((len(first), 1), batch, np.int32), sites[first]], axis=1)
    return features[first].astype(np.float32), coords
