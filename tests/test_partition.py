"""The partitioner: device assignment from capability tables, acyclic deterministic segments, segment
models and manifest, running the segments in order against the whole model, reports and the CLI."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import sparse_lower
from conftest import DATA
from oracle import IR_VERSION, random_sparse
from sparse_lower import partition
from sparse_lower.cli.main import main
from sparse_lower.errors import SparseLowerError
from sparse_lower.frames.sample import load_voxels
from sparse_lower.models import SparseModelBuilder, centerpoint_head_stack
from sparse_lower.partition import NNA_OPS, Partition, Segment, ValueTypes, nna_support
from sparse_lower.partition.node_costs import macs
from sparse_lower.partition.partitioner import partition as partition_graph

OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("sparse_lower", 1)]


def make_model(nodes, inputs, outputs, initializers=(), value_info=()):
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers), value_info=list(value_info))
    model = helper.make_model(graph, opset_imports=OPSETS, ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def tensor(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def run_whole(model, feeds):
    session = sparse_lower.create_session(model)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def assert_runs_like_the_whole_model(parts: Partition, model, feeds):
    got = parts.run(feeds)
    expected = run_whole(model, feeds)
    assert list(got) == list(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def devices_and_nodes(parts: Partition):
    return [(s.device, list(s.nodes)) for s in parts.segments]


def index_model():
    """An nna-style layer with static shapes: index tables (custom op, int64 Transpose and Add) feed
    float compute (Pad, Gather, MatMul, ReduceSum) on the gathered rows of a 3x3 submanifold conv."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("SubmanifoldMap", ["coords"], ["nbr"], name="map", domain="sparse_lower",
                         kernel_shape=[3, 3], spatial_shape=[6, 6]),
        helper.make_node("Transpose", ["nbr"], ["nbr_t"], name="nbr_t", perm=[1, 0]),
        helper.make_node("Add", ["nbr_t", "one"], ["rows"], name="shift"),  # -1 (no neighbour) -> the zero row
        helper.make_node("Pad", ["features", "zero_row"], ["padded"], name="pad"),
        helper.make_node("Gather", ["padded", "rows"], ["gathered"], name="gather", axis=0),
        helper.make_node("MatMul", ["gathered", "W"], ["partial"], name="matmul"),
        helper.make_node("ReduceSum", ["partial", "tap_axis"], ["out"], name="sum", keepdims=0),
    ]
    return make_model(
        nodes, [tensor("coords", TensorProto.INT64, [16, 3]), tensor("features", TensorProto.FLOAT, [16, 4])],
        [tensor("out", TensorProto.FLOAT, [16, 5])],
        [const("one", np.int64(1)), const("zero_row", np.array([1, 0, 0, 0], np.int64)),
         const("W", rng.standard_normal((9, 4, 5)).astype(np.float32)), const("tap_axis", np.array([0], np.int64))],
        # The index builder's output shape, as a lowering with a fixed capacity writes it.
        value_info=[tensor("nbr", TensorProto.INT64, [16, 9])])


def index_feeds(rng):
    features, coords = random_sparse(rng, 1, 4, (6, 6), count=16)
    return {"coords": coords, "features": features}


def test_index_arithmetic_runs_on_the_gpu_and_float_compute_on_the_nna(rng):
    model = index_model()
    parts = partition(model)
    assert devices_and_nodes(parts) == [("gpu", ["map", "nbr_t", "shift"]), ("nna", ["pad", "gather", "matmul", "sum"])]
    assert parts.segments[0] == Segment(0, "gpu", ("map", "nbr_t", "shift"), ("coords",), ("rows",))
    assert parts.segments[1].inputs == ("features", "rows")  # initializers are embedded, not inputs
    assert parts.reasons["map"]["nna"] == "sparse_lower::SubmanifoldMap is not in the nna capability table"
    assert parts.reasons["shift"]["nna"] == "the nna computes on float tensors; this node outputs int64 ('rows')"
    assert parts.reasons["gather"] == {}
    assert parts.assignment["matmul"] == "nna"
    assert_runs_like_the_whole_model(parts, model, index_feeds(rng))


def test_a_diamond_that_a_per_device_merge_would_make_cyclic(rng):
    # a (gpu) -> b (nna) -> d (gpu) and a -> c (gpu) -> d: {a, c, d} as one gpu segment would need b
    # before it and after it.
    nodes = [
        helper.make_node("Add", ["idx", "one"], ["a"], name="a"),
        helper.make_node("Gather", ["table", "a"], ["b"], name="b", axis=0),
        helper.make_node("Slice", ["a", "start", "end"], ["c"], name="c"),
        helper.make_node("Tile", ["b", "c"], ["d"], name="d"),
    ]
    model = make_model(nodes, [tensor("table", TensorProto.FLOAT, [4, 3]), tensor("idx", TensorProto.INT64, [4])],
                       [tensor("d", TensorProto.FLOAT, [None, None])],
                       [const("one", np.int64(1)), const("start", np.array([0], np.int64)),
                        const("end", np.array([2], np.int64))])
    parts = partition(model)
    assert devices_and_nodes(parts) == [("gpu", ["a", "c"]), ("nna", ["b"]), ("gpu", ["d"])]
    assert parts.segments[2].inputs == ("b", "c")
    assert parts.reasons["d"]["nna"] == "Tile is not in the nna capability table"
    feeds = {"table": rng.standard_normal((4, 3)).astype(np.float32), "idx": np.array([0, 2, 1, 0], np.int64)}
    assert_runs_like_the_whole_model(parts, model, feeds)


def test_same_device_segments_merge_when_no_cycle_forms(rng):
    # The device-aware order gives gpu [g0], nna [relu], gpu [cast]; nothing joins g0 to the cast
    # through the nna, so the two gpu runs become one segment after the nna one.
    nodes = [helper.make_node("Add", ["i", "one"], ["o1"], name="g0"),
             helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Cast", ["r"], ["o2"], name="cast", to=TensorProto.INT64)]
    model = make_model(nodes, [tensor("x", TensorProto.FLOAT, [4, 8]), tensor("i", TensorProto.INT64, [4])],
                       [tensor("o1", TensorProto.INT64, [4]), tensor("o2", TensorProto.INT64, [4, 8])],
                       [const("one", np.int64(1))])
    parts = partition(model)
    assert devices_and_nodes(parts) == [("nna", ["relu"]), ("gpu", ["g0", "cast"])]
    assert parts.segments[1].inputs == ("i", "r")
    feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32), "i": np.arange(4, dtype=np.int64)}
    assert_runs_like_the_whole_model(parts, model, feeds)


def symbolic_model():
    nodes = [helper.make_node("MatMul", ["features", "W"], ["rows"], name="matmul"),
             helper.make_node("Reshape", ["rows", "shape"], ["flat"], name="reshape"),
             helper.make_node("Relu", ["flat"], ["out"], name="relu")]
    return make_model(nodes, [tensor("features", TensorProto.FLOAT, ["N", 4]), tensor("shape", TensorProto.INT64, [1])],
                      [tensor("out", TensorProto.FLOAT, [None])],
                      [const("W", np.ones((4, 2), np.float32))])


def test_static_shapes_decide_the_nna(rng):
    model = symbolic_model()
    parts = partition(model)
    assert devices_and_nodes(parts) == [("gpu", ["matmul", "reshape", "relu"])]
    assert parts.reasons["matmul"]["nna"] == ("input 'features' has the non-static dim N (shape [N, 4]); "
                                              "the nna needs static shapes")
    assert parts.reasons["reshape"]["nna"] == ("input 'rows' has the non-static dim N (shape [N, 2]); "
                                               "the nna needs static shapes")
    assert parts.reasons["relu"]["nna"].startswith("input 'flat' has the non-static dim")  # a symbol of ONNX's

    dynamic = partition(model, static_shapes=False)
    assert devices_and_nodes(dynamic) == [("nna", ["matmul", "reshape", "relu"])]
    assert dynamic.reasons["matmul"] == {}
    feeds = {"features": rng.standard_normal((5, 4)).astype(np.float32), "shape": np.array([10], np.int64)}
    assert_runs_like_the_whole_model(dynamic, model, feeds)


def test_unknown_shape_and_type_are_refused_with_the_tensor_named():
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    no_shape = ValueTypes({"x": helper.make_tensor_type_proto(TensorProto.FLOAT, None),
                           "y": helper.make_tensor_type_proto(TensorProto.FLOAT, [2])})
    assert nna_support()(node, no_shape) == "input 'x' has an unknown shape; the nna needs static shapes"
    assert nna_support()(node, ValueTypes({})) == ("output 'y' has an unknown element type; "
                                                   "the nna computes on float tensors")
    assert nna_support(static_shapes=False)(node, no_shape) is None


def test_an_unlowered_model_is_told_to_lower_first():
    builder = SparseModelBuilder(2, 4, np.random.default_rng(0))
    builder.conv("SubmanifoldConv", 8, (3, 3), (10, 12))
    with pytest.raises(SparseLowerError, match=r"the model holds 1 source op \(e.g. 'submanifoldconv0', "
                                               r"SubmanifoldConv\): a partition splits a lowered model") as error:
        partition(builder.build())
    assert "sparse-lower convert MODEL -o MODEL.nna.onnx --target nna" in error.value.fix


def test_an_unlowered_sparse_node_runs_nowhere():
    builder = SparseModelBuilder(2, 4, np.random.default_rng(0))
    builder.conv("SubmanifoldConv", 8, (3, 3), (10, 12))
    with pytest.raises(SparseLowerError) as error:
        partition_graph(builder.build(), ("nna", "gpu", "cpu"))  # the partitioner itself, which names each device
    assert error.value.node == "submanifoldconv0"
    assert "gpu: not lowered; run sparse_lower.lower first" in str(error.value)
    assert "nna: sparse::SubmanifoldConv is not in the nna capability table" in str(error.value)


def test_a_node_no_listed_device_accepts_names_node_and_reasons():
    with pytest.raises(SparseLowerError, match="node 'nbr_t': no device can run this Transpose node "
                                               r"\(nna: the nna computes on float tensors; this node outputs int64 "
                                               r"\('nbr_t'\); dsp: Transpose: the dsp runs custom ops only\)"):
        partition(index_model(), devices=("nna", "dsp"), support={"dsp": lambda node, types: (
            None if node.domain else f"{node.op_type}: the dsp runs custom ops only")})
    with pytest.raises(SparseLowerError, match=r"unknown devices \['tpu'\]"):
        partition(index_model(), devices=("nna", "tpu"))


def test_support_adds_a_device_and_replaces_a_table(rng):
    def dsp(node, types):
        return None if node.op_type in ("MatMul", "ReduceSum") else f"{node.op_type}: the dsp only multiplies"

    model = index_model()
    parts = partition(model, devices=("dsp", "nna", "cpu"), support={"dsp": dsp, "nna": lambda node, types: "off"})
    assert devices_and_nodes(parts) == [("cpu", ["map", "nbr_t", "shift", "pad", "gather"]), ("dsp", ["matmul", "sum"])]
    assert parts.reasons["pad"] == {"dsp": "Pad: the dsp only multiplies", "nna": "off"}
    assert_runs_like_the_whole_model(parts, model, index_feeds(rng))


def lowered_stack(strategy="unfold"):
    rng = np.random.default_rng(5)
    builder = SparseModelBuilder(3, 4, rng)
    builder.conv("SubmanifoldConv", 8, (3, 3, 3), (10, 12, 14)).relu()
    builder.conv("SparseConv", 8, (3, 3, 3), (10, 12, 14), strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1]).relu()
    builder.conv("SparseDeconv", 4, (2, 2, 2), (5, 6, 7), strides=[2, 2, 2])
    return sparse_lower.lower(builder.build(), target="gpu", strategy=strategy)


@pytest.mark.parametrize("strategy", ["unfold", "rulebook", "fused"])
@pytest.mark.parametrize("static_shapes", [True, False])
def test_gpu_lowered_models_run_exactly_like_the_whole_model(rng, strategy, static_shapes):
    model = lowered_stack(strategy)
    parts = partition(model, static_shapes=static_shapes)
    if static_shapes:  # every compute tensor has N rows: nothing is static, all runs on the gpu
        assert [s.device for s in parts.segments] == ["gpu"]
    elif strategy == "fused":  # the Relus are inside the IndexedConvs: no standard op is left for the nna
        assert [s.device for s in parts.segments] == ["gpu"]
    else:
        assert {s.device for s in parts.segments} == {"gpu", "nna"}
        assert all(parts.assignment[n.name] == "gpu" for n in model.graph.node if n.domain == "sparse_lower")
        assert all(parts.assignment[n.name] == "nna" for n in model.graph.node if n.op_type == "MatMul")
    features, coords = random_sparse(rng, 2, 4, (10, 12, 14), count=300)
    assert_runs_like_the_whole_model(parts, model, {"features": features, "coords": coords})


def test_centerpoint_stack_alternates_gpu_and_nna_and_reruns(rng):
    model = sparse_lower.lower(centerpoint_head_stack(spatial_shape=(10, 40, 40)), target="gpu", strategy="unfold")
    parts = partition(model, static_shapes=False)
    assert [s.device for s in parts.segments] == ["gpu", "nna"] * 3
    assert parts.segments[0].outputs[:2] == ("submanifoldconv0/nbr", "sparseconv4/nbr")  # tables built once, first
    for count in (400, 700):  # cached sessions, other sizes
        features, coords = random_sparse(rng, 2, 5, (10, 40, 40), count=count)
        assert_runs_like_the_whole_model(parts, model, {"features": features, "coords": coords})


@pytest.mark.parametrize("combine", ["gather", "scatter", "matmul", "pairs", "unfold"])
def test_nna_lowered_models_put_index_work_on_the_gpu_and_convs_on_the_nna(rng, combine):
    source = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    model = sparse_lower.lower(source, target="nna", combine=combine, max_active=1200)
    parts = partition(model)
    assert parts.segments[0].device == "gpu" and "nna" in {s.device for s in parts.segments}
    assert all(parts.assignment[n.name] == "gpu" for n in model.graph.node if n.domain == "sparse_lower")
    assert all(parts.assignment[n.name] == "nna" for n in model.graph.node if n.op_type == "Conv")
    for segment in parts.segments:
        if segment.device == "nna":
            model_of_segment = parts.segment_model(segment.index)
            assert all(parts.types.static_shape(v.name) for v in model_of_segment.graph.input)
    features, coords = random_sparse(rng, 2, 5, (10, 40, 40), count=150)  # at most 8 x 150 strided outputs
    assert_runs_like_the_whole_model(parts, model, {"features": features, "coords": coords})


def test_types_unknown_to_onnx_come_from_onnxruntime(rng):
    model = lowered_stack()
    del model.graph.value_info[:]  # ONNX shape inference stops at the first custom op
    parts = partition(model)
    assert parts.types.elem_type("submanifoldconv0/nbr") == TensorProto.INT64
    assert parts.types.shape("submanifoldconv0/nbr") == ("N", 27)
    assert parts.reasons["sparsedeconv4.coords_alias"]["nna"].startswith("the nna computes on float tensors")
    features, coords = random_sparse(rng, 2, 4, (10, 12, 14), count=200)
    assert_runs_like_the_whole_model(parts, model, {"features": features, "coords": coords})
    # onnxruntime does not tell the rank of a data-dependent output: a segment cannot declare it.
    with pytest.raises(SparseLowerError, match="exchanges 'sparseconv2/out_coords', whose int64\\[\\?\\] type is not "
                                               "fully known.*fix: add a value_info entry"):
        partition(model, static_shapes=False).segment_model(0)


def run_from_files(directory, feeds):
    """An executor that knows only what to_onnx wrote: the manifest and the segment files."""
    manifest = json.loads((directory / "manifest.json").read_text())
    values = dict(feeds)
    for entry in manifest["segments"]:
        session = sparse_lower.create_session(str(directory / entry["file"]))
        outputs = [o["name"] for o in entry["outputs"]]
        values.update(zip(outputs, session.run(outputs, {i["name"]: values[i["name"]] for i in entry["inputs"]})))
    return {o["name"]: values[o["name"]] for o in manifest["outputs"]}


def test_to_onnx_writes_checked_models_and_a_manifest_of_the_flow(tmp_path, rng):
    model = sparse_lower.lower(centerpoint_head_stack(spatial_shape=(10, 40, 40)), target="gpu", strategy="unfold")
    parts = partition(model, static_shapes=False)
    manifest_path = parts.to_onnx(tmp_path)
    manifest = json.loads(manifest_path.read_text())
    assert manifest_path == tmp_path / "manifest.json"
    assert sorted(p.name for p in tmp_path.glob("*.onnx")) == [f"{i:02d}_{d}.onnx" for i, d in
                                                               enumerate(["gpu", "nna"] * 3)]
    assert manifest["inputs"] == [{"name": "features", "type": "float32[N, 5]"},
                                  {"name": "coords", "type": "int64[N, 4]"}]
    assert manifest["outputs"] == [{"name": "sparseconv4.features", "type": "float32[?, 32]", "from": 5},
                                   {"name": "sparseconv4.coords", "type": "int64[?, 4]", "from": 0}]
    for entry, segment in zip(manifest["segments"], parts.segments):
        assert (entry["index"], entry["device"], entry["nodes"]) == (segment.index, segment.device, list(segment.nodes))
        saved = onnx.load(tmp_path / entry["file"])
        onnx.checker.check_model(saved, full_check=True)
        assert saved.ir_version == model.ir_version
        domains = {o.domain for o in saved.opset_import}  # the segment's own: nna segments lose sparse_lower
        assert domains == ({"", "sparse_lower"} if segment.device == "gpu" else {""}), (segment.device, domains)
        assert all(o in model.opset_import for o in saved.opset_import)
        assert [v.name for v in saved.graph.input] == [i["name"] for i in entry["inputs"]]
        assert all(v.type.tensor_type.elem_type for v in (*saved.graph.input, *saved.graph.output))
        for value in entry["inputs"]:  # every input comes from the graph or an earlier segment's outputs
            source = value["from"]
            assert source == "input" or (source < entry["index"] and value["name"] in
                                         [o["name"] for o in manifest["segments"][source]["outputs"]])
        for value in entry["outputs"]:
            assert all(reader > entry["index"] for reader in value["to"])
            assert value["to"] or value["graph_output"]
    nna = manifest["segments"][1]
    assert nna["inputs"] == [{"name": "submanifoldconv0/cols", "type": "float32[?, 135]", "from": 0}]
    assert nna["outputs"] == [{"name": "relu1", "type": "float32[?, 16]", "to": [2], "graph_output": False}]
    features, coords = random_sparse(rng, 2, 5, (10, 40, 40), count=500)
    feeds = {"features": features, "coords": coords}
    expected = run_whole(model, feeds)
    for name, value in run_from_files(tmp_path, feeds).items():
        np.testing.assert_array_equal(value, expected[name])


def test_values_read_inside_subgraphs_cross_segments(rng):
    # The If's branches read `r` (made on the nna) from the outer graph: the gpu segment takes it as input.
    def branch(op):
        return helper.make_graph([helper.make_node(op, ["r"], [f"{op}_out"])], op, [],
                                 [tensor(f"{op}_out", TensorProto.FLOAT, [4])])

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("If", ["flag"], ["y"], name="if", then_branch=branch("Neg"), else_branch=branch("Abs"))]
    model = make_model(nodes, [tensor("x", TensorProto.FLOAT, [4]), tensor("flag", TensorProto.BOOL, [])],
                       [tensor("y", TensorProto.FLOAT, [4])])
    parts = partition(model)
    assert devices_and_nodes(parts) == [("nna", ["relu"]), ("gpu", ["if"])]
    assert parts.segments[1].inputs == ("flag", "r") and parts.segments[0].outputs == ("r",)
    x = rng.standard_normal(4).astype(np.float32)
    for flag in (True, False):
        assert_runs_like_the_whole_model(parts, model, {"x": x, "flag": np.array(flag)})


def test_constants_are_copied_into_the_segments_that_read_them(rng):
    # A Constant shape feeding an nna Reshape and a gpu Reshape: each segment embeds its own copy, so the
    # nna segment gets no int64 run-time input.
    shape = helper.make_tensor("shape_value", TensorProto.INT64, [2], [2, 8])
    nodes = [helper.make_node("Constant", [], ["shape"], name="shape", value=shape),
             helper.make_node("Reshape", ["x", "shape"], ["y"], name="nna_reshape"),
             helper.make_node("Reshape", ["i", "shape"], ["j"], name="gpu_reshape")]
    model = make_model(nodes, [tensor("x", TensorProto.FLOAT, [4, 4]), tensor("i", TensorProto.INT64, [16])],
                       [tensor("y", TensorProto.FLOAT, [2, 8]), tensor("j", TensorProto.INT64, [2, 8])])
    parts = partition(model)
    assert devices_and_nodes(parts) == [("nna", ["nna_reshape"]), ("gpu", ["gpu_reshape"])]
    assert "shape" not in parts.reasons and parts.segments[0].inputs == ("x",)
    for segment in parts.segments:
        assert [n.op_type for n in parts.segment_model(segment.index).graph.node] == ["Constant", "Reshape"]
    feeds = {"x": rng.standard_normal((4, 4)).astype(np.float32), "i": np.arange(16, dtype=np.int64)}
    assert_runs_like_the_whole_model(parts, model, feeds)


def test_unnamed_and_duplicate_nodes_get_stable_names(rng):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"], name="dup"),
             helper.make_node("Relu", ["b"], ["c"], name="dup"), helper.make_node("Relu", ["c"], ["d"], name="Relu_0")]
    model = make_model(nodes, [tensor("x", TensorProto.FLOAT, [3])], [tensor("d", TensorProto.FLOAT, [3])])
    parts = partition(model)
    assert parts.segments[0].nodes == ("Relu_0_", "Relu_1", "Relu_2", "Relu_0")
    assert [n.name for n in parts.segment_model(0).graph.node] == list(parts.segments[0].nodes)
    # onnxruntime refuses the model itself (two nodes named 'dup'), not its segments.
    np.testing.assert_array_equal(parts.run({"x": np.array([-1, 0, 2], np.float32)})["d"], [0, 0, 2])


def test_partitioning_is_deterministic(tmp_path):
    model = lowered_stack("rulebook")
    first = partition(model, static_shapes=False)
    second = partition(onnx.load_from_string(model.SerializeToString()), static_shapes=False)
    assert first.segments == second.segments and first.reasons == second.reasons
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    from_path = partition(path, static_shapes=False)
    assert from_path.segments == first.segments
    first.to_onnx(tmp_path / "a")
    from_path.to_onnx(tmp_path / "b")
    for file in sorted((tmp_path / "a").iterdir()):
        assert file.read_bytes() == (tmp_path / "b" / file.name).read_bytes(), file.name


def test_refusals_are_logged(caplog):
    with caplog.at_level(logging.INFO, logger="sparse_lower.partition"):
        partition(index_model())
    messages = [r.getMessage() for r in caplog.records if r.name == "sparse_lower.partition"]
    assert "node 'map' (SubmanifoldMap) runs on gpu: nna refused: sparse_lower::SubmanifoldMap is not in the nna " \
           "capability table" in messages
    assert not [m for m in messages if "'gather'" in m]


def test_macs_of_conv_matmul_and_gemm():
    shapes = {"x": (1, 8, 1, 10), "w": (4, 8, 1, 1), "y": (1, 4, 1, 10), "a": (3, 5, 6), "b": (6, 7),
              "m": (3, 5, 7), "g": (6, 5), "gy": (5, 2)}
    conv = helper.make_node("Conv", ["x", "w"], ["y"])
    assert macs(conv, shapes.get) == 4 * 10 * 8
    assert macs(helper.make_node("MatMul", ["a", "b"], ["m"]), shapes.get) == 3 * 5 * 6 * 7
    assert macs(helper.make_node("Gemm", ["g", "w2"], ["gy"], transA=1), shapes.get) == 5 * 6 * 2
    assert macs(helper.make_node("Relu", ["x"], ["r"]), shapes.get) == 0
    assert macs(helper.make_node("MatMul", ["a", "b"], ["unknown"]), shapes.get) is None


def test_summary_counts_static_shapes_and_then_the_last_run(rng):
    parts = partition(index_model())
    lines = parts.summary().splitlines()
    assert lines[0].split() == ["segment", "device", "nodes", "ops", "MACs", "bytes", "in", "bytes", "out"]
    assert lines[2].split()[:3] == ["00", "gpu", "3"] and lines[2].split()[-3:] == ["0", "384", "1,152"]
    assert lines[3].split()[-3:] == [f"{9 * 16 * 5 * 4:,}", f"{16 * 4 * 4 + 9 * 16 * 8:,}", f"{16 * 5 * 4:,}"]
    assert "Gather x1, MatMul x1, Pad x1, ReduceSum x1" in lines[3]

    model = sparse_lower.lower(centerpoint_head_stack(spatial_shape=(10, 40, 40)), target="gpu", strategy="unfold")
    whole = partition(model)
    assert whole.summary().splitlines()[2].split()[-3:] == ["?", "?", "?"]
    features, coords = random_sparse(rng, 2, 5, (10, 40, 40), count=500)
    n_out = len(whole.run({"features": features, "coords": coords})["sparseconv4.coords"])
    expected_macs = 500 * 27 * 5 * 16 + 500 * 27 * 16 * 16 + n_out * 27 * 16 * 32
    row = whole.summary().splitlines()[2].split()
    assert row[-3:] == [f"{expected_macs:,}", f"{500 * 5 * 4 + 500 * 4 * 8:,}", f"{n_out * 32 * 4 + n_out * 4 * 8:,}"]


def test_dot_and_picture(tmp_path):
    parts = partition(index_model())
    dot = parts.to_dot()
    assert dot.startswith("digraph partition {") and dot.rstrip().endswith("}")
    assert 'subgraph cluster_0 {\n    label="00 gpu (3 nodes)";' in dot
    assert 'fillcolor="#9ad29a"' in dot  # the nna segment's colour
    assert 'n2 -> n4 [label="rows", color="#c0392b", penwidth=2];' in dot  # crossing tensor
    assert "n0 -> n1;" in dot and '"input:coords" -> n0;' in dot and '-> "output:out";' in dot
    pytest.importorskip("matplotlib")
    assert parts.save_picture(tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in parts.save_picture(tmp_path / "p.svg").read_bytes()
    with pytest.raises(SparseLowerError, match="give a .png or .svg path"):
        parts.save_picture(tmp_path / "p.jpg")


def test_run_checks_the_feeds():
    parts = partition(index_model())
    with pytest.raises(SparseLowerError, match=r"missing \['features'\], unknown \['feature'\]"):
        parts.run({"coords": np.zeros((16, 3), np.int64), "feature": np.zeros((16, 4), np.float32)})


def test_cli_partition_end_to_end(tmp_path, rng, capsys):
    pytest.importorskip("matplotlib")
    model = sparse_lower.lower(centerpoint_head_stack(spatial_shape=(10, 40, 40)), target="gpu", strategy="unfold")
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    features, coords = random_sparse(rng, 2, 5, (10, 40, 40), count=300)
    np.savez(tmp_path / "inputs.npz", features=features, coords=coords)
    out = tmp_path / "segments"
    assert main(["partition", str(path), "--out-dir", str(out), "--dynamic", "--inputs", str(tmp_path / "inputs.npz"),
                 "--reasons", "--picture"]) == 0
    text = capsys.readouterr().out
    assert "run: outputs equal the unpartitioned model" in text
    assert "sparse_lower::IndexedUnfold is not in the nna capability table" in text
    assert re.search(r"^05 +nna +2 +Add x1, MatMul x1 ", text, re.M), text
    assert (out / "manifest.json").exists() and (out / "picture.png").exists()
    assert len(list(out.glob("*.onnx"))) == 6

    assert main(["partition", str(path), "--out-dir", str(tmp_path / "gpu"), "--devices", "gpu"]) == 0
    assert "wrote 1 segment and" in capsys.readouterr().out

    source = tmp_path / "source.onnx"
    onnx.save(centerpoint_head_stack(spatial_shape=(10, 40, 40)), source)
    assert main(["partition", str(source), "--out-dir", str(tmp_path / "x")]) == 2
    assert "lower it first: `sparse-lower convert MODEL" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # a refused partition leaves no folder behind


@pytest.mark.parametrize("combine", ["gather", "scatter", "matmul", "pairs", "unfold"])
def test_the_nna_segment_holds_only_table_ops_with_static_shapes(combine):
    model = sparse_lower.lower(centerpoint_head_stack(spatial_shape=(10, 40, 40)), target="nna", combine=combine,
                               max_active=1200, fuse_taps=combine == "scatter")
    parts = partition(model)
    assert [s.device for s in parts.segments] == ["gpu", "nna", "gpu"], "index tables, compute, output slice"
    nodes = {n.name: n for n in model.graph.node}
    (nna,) = [s for s in parts.segments if s.device == "nna"]
    for name in nna.nodes:
        node = nodes[name]
        assert node.domain == "" and node.op_type in NNA_OPS, node.op_type
        for tensor_name in (*node.input, *node.output):
            assert not tensor_name or parts.types.static_shape(tensor_name) is not None, (name, tensor_name)
    assert sum(nodes[n].op_type == "Conv" for n in nna.nodes) == (3 if combine in ("scatter", "unfold") else 3 * 27)


@pytest.mark.skipif(not (DATA / "nuscenes_centerpoint_voxels.npz").exists(), reason="shared data absent")
@pytest.mark.parametrize("target", ["nna", "hybrid"])
def test_partition_runs_the_real_centerpoint_frame_like_the_whole_model(target):
    features, coords, grid = load_voxels(DATA / "nuscenes_centerpoint_voxels.npz")
    source = centerpoint_head_stack(spatial_shape=grid)  # SubM, SubM, strided SparseConv
    model = sparse_lower.lower(source, target=target, max_active=80_000)
    parts = partition(model)
    assert "nna" in {s.device for s in parts.segments}
    feeds = {"features": features, "coords": coords}
    assert_runs_like_the_whole_model(parts, model, feeds)
    expected = sparse_lower.reference.run(source, feeds)
    got = parts.run(feeds)
    np.testing.assert_array_equal(got["sparseconv4.coords"], expected["sparseconv4.coords"])
    np.testing.assert_allclose(got["sparseconv4.features"], expected["sparseconv4.features"], rtol=1e-4, atol=1e-4)


def test_summary_reports_each_sparse_layer_per_method():
    source = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    parts = partition(sparse_lower.lower(source, target="nna", max_active=1000))
    text = parts.summary()
    assert "sparse layers, MACs (millions) per method at 1,000 active sites:" in text
    # SubM 3x3x3 5->16 at N = 1000: gpu 27*1000*5*16 = 2.16 M; matmul + 27*1000*1000*16 = 432 M
    row = next(line for line in text.splitlines() if line.startswith("submanifoldconv0"))
    assert row.split()[1:4] == ["SubmanifoldConv", "2.2", "434.2"]
    assert "at 50 active sites" in parts.summary(active=50)
