"""Accelerator toolchains (docs/toolchains.md): the nna segments of a partition compiled by OpenVINO,
Apache TVM, rknn-toolkit2 (simulator) and LiteRT through onnx2tf, run across runtimes (host segments in
onnxruntime) and compared with the unpartitioned model within the toolchain's precision; index inputs
narrowed to int32; the forms a toolchain is measured to mistranslate refused. Each toolchain's tests
skip, with the reason, where its pip extra is not installed."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import sparse_lower
from conftest import DATA
from oracle import IR_VERSION
from sparse_lower.cli.main import main
from sparse_lower.errors import SparseLowerError
from sparse_lower.frames.sample import load_voxels
from sparse_lower.models import CanonicalEmitter, centerpoint_head_stack, small_networks
from sparse_lower.partition.segments import NodeGraph
from sparse_lower.quantization import choose_wide_layers
from sparse_lower.quantization.calibration import activation_ranges, segment_samples
from sparse_lower.quantization.products import first_and_last_products, weight_products
from sparse_lower.quantization.htp import layer_tensors
from sparse_lower.quantization.qdq import quantize_qdq
from sparse_lower.toolchains import TOOLCHAINS, CompiledPartition, compile_partition, toolchain
from sparse_lower.toolchains.prepare import fed, narrowable_inputs, prepare
from sparse_lower.toolchains.rknn import derived_tensors
from sparse_lower.partition.value_types import describe_type
from sparse_lower.verify import example_inputs, relative_error


MODELS = small_networks()


def available(name):
    reason = toolchain(name).missing()
    if reason:
        pytest.skip(reason)
    return toolchain(name)


def whole(model, feeds):
    session = sparse_lower.create_session(model)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def assert_runs_across_runtimes(lowered, feeds, name, directory, tolerance=None):
    compiled = compile_partition(sparse_lower.partition(lowered), name, directory)
    assert {e["device"] for e in compiled.manifest["segments"]} >= {"nna"}
    assert all("artifact" in e for e in compiled.manifest["segments"] if e["device"] == "nna")
    expected = whole(lowered, feeds)
    for run in (compiled, CompiledPartition(directory)):  # fresh, and again from the files alone
        got = run.run(feeds)
        assert list(got) == list(expected)
        for output, value in expected.items():
            assert relative_error(got[output], value) <= (tolerance or compiled.toolchain.tolerance), output
    return compiled


# (toolchain, layout, combine): the forms each toolchain runs on its accelerator (docs/toolchains.md)
FORMS = [("openvino", "image", "gather"), ("openvino", "image", "scatter"), ("openvino", "rows", "matmul"),
         ("openvino", "rows", "pairs"), ("tvm", "image", "gather"), ("tvm", "rows", "scatter"),
         ("tvm", "image", "matmul"), ("tvm", "image", "pairs"), ("rknn", "rows", "matmul"),
         ("tflite", "rows", "gather"), ("tflite", "rows", "matmul"), ("tflite", "rows", "pairs"),
         ("qnn", "rows", "gather"), ("qnn", "rows", "matmul"), ("qnn", "rows", "pairs"), ("qnn", "rows", "unfold"),
         ("openvino", "image", "unfold"), ("tvm", "rows", "unfold")]


@pytest.mark.parametrize("case", range(len(MODELS)), ids=[m[0] for m in MODELS])
@pytest.mark.parametrize("name,layout,combine", FORMS)
def test_every_table_model_runs_in_the_toolchain_like_onnxruntime(name, layout, combine, case, tmp_path):
    available(name)
    _, model, active, capacity = MODELS[case]
    if name == "rknn" and case != 0:
        pytest.skip("rknn-toolkit2 builds take a minute each: the single SubM stands for the others here")
    feeds = example_inputs(model, np.random.default_rng(case), active=active)
    lowered = sparse_lower.lower(model, target="nna", combine=combine, max_active=capacity, layout=layout)
    compiled = assert_runs_across_runtimes(lowered, feeds, name, tmp_path)
    assert not compiled.fallbacks, "every op on the accelerator"


@pytest.mark.parametrize("combine", ["gather", "pairs"])
def test_rknn_places_gathers_on_its_cpu(combine, tmp_path):
    available("rknn")
    _, model, active, capacity = MODELS[0]
    lowered = sparse_lower.lower(model, target="nna", combine=combine, max_active=capacity, layout="rows")
    compiled = assert_runs_across_runtimes(lowered, example_inputs(model, np.random.default_rng(0), active=active),
                                           "rknn", tmp_path)
    # the pairs combine's per-tap gathers of one tensor reach rknn as one, of their indices side by side
    assert {op for _, op, _, _ in compiled.fallbacks} == {"Gather", "Pad"} | ({"Concat"} if combine == "pairs" else set())


def test_qnn_runs_scatter_add_on_the_cpu_and_the_rest_on_its_htp(tmp_path):
    available("qnn")
    _, model, active, capacity = MODELS[0]
    lowered = sparse_lower.lower(model, target="nna", combine="scatter", max_active=capacity, layout="rows")
    compiled = assert_runs_across_runtimes(lowered, example_inputs(model, np.random.default_rng(0), active=active),
                                           "qnn", tmp_path)
    assert {op for _, op, _, _ in compiled.fallbacks} == {"ScatterElements"}
    (entry,) = [e for e in compiled.manifest["segments"] if e["device"] == "nna"]
    assert {unit for _, unit, _ in entry["placement"]} == {"HTP", "CPU"}
    assert {op for op, unit, _ in entry["placement"] if unit == "HTP"} >= {"MatMul", "Add"}


def test_qnn_writes_a_context_model_that_runs_without_compiling(tmp_path):
    available("qnn")
    _, model, active, capacity = MODELS[3]
    lowered = sparse_lower.lower(model, target="nna", combine="gather", max_active=capacity, layout="rows")
    assert_runs_across_runtimes(lowered, example_inputs(model, np.random.default_rng(3), active=active), "qnn",
                                tmp_path)
    artifact = onnx.load(tmp_path / "01_nna.qnn")
    assert [node.op_type for node in artifact.graph.node] == ["EPContext"], "the whole segment is one HTP graph"
    assert dict((a.name, a.i) for a in artifact.graph.node[0].attribute if a.name == "embed_mode") == {"embed_mode": 1}


@pytest.mark.parametrize("name,case,combine,why", [
    ("qnn", 3, "gather", "QNN's HTP computes the nna image layout wrong"),
    ("qnn", 4, "gather", "QNN's HTP computes the nna image layout wrong"),
    ("tflite", 0, "matmul", "onnx2tf mistranslates the nna image layout")])
def test_the_image_layout_is_refused_where_a_toolchain_computes_it_wrong(name, case, combine, why, tmp_path):
    available(name)
    network = MODELS[case]
    parts = sparse_lower.partition(sparse_lower.lower(network.model, target="nna", combine=combine,
                                                      max_active=network.capacity))
    with pytest.raises(SparseLowerError, match=f"{why}.*fix: lower with layout='rows'"):
        compile_partition(parts, name, tmp_path)


def test_int8_is_refused_for_litert(tmp_path):
    available("tflite")
    network = MODELS[0]
    parts = sparse_lower.partition(sparse_lower.lower(network.model, target="nna", max_active=network.capacity,
                                                      layout="rows"))
    with pytest.raises(SparseLowerError, match="int8 for LiteRT is not supported"):
        compile_partition(parts, "tflite", tmp_path, calibration=calibration_frames(network.model))


def test_litert_reports_onnx2tf_refusing_scatter_add(tmp_path):
    available("tflite")
    _, model, _, capacity = MODELS[0]
    parts = sparse_lower.partition(sparse_lower.lower(model, target="nna", combine="scatter", max_active=capacity,
                                                      layout="rows"))
    with pytest.raises(SparseLowerError, match="onnx2tf could not convert 01_nna: .*ScatterElements currently "
                                               "supports only reduction=\\['none'\\]"):
        compile_partition(parts, "tflite", tmp_path)


@pytest.mark.skipif(not (DATA / "nuscenes_bevfusion_voxels.npz").is_file(), reason="needs ../shared/data")
@pytest.mark.parametrize("layout", ["image", "rows"])
def test_the_unet_on_a_real_frame_runs_in_openvino_from_the_command_line(layout, tmp_path, capsys):
    available("openvino")
    features, coords, _ = load_voxels(DATA / "nuscenes_bevfusion_voxels.npz")
    np.savez(tmp_path / "frame.npz", features=features, coords=coords)  # float16 and int32, as the data comes
    unet = sparse_lower.models.sparse_unet(CanonicalEmitter(), np.random.default_rng(0))
    onnx.save(sparse_lower.lower(unet, target="nna", max_active=30000, layout=layout), tmp_path / "unet.nna.onnx")
    status = main(["partition", str(tmp_path / "unet.nna.onnx"), "--out-dir", str(tmp_path / "segments"),
                   "--for", "openvino", "--inputs", str(tmp_path / "frame.npz")])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "run (OpenVINO, fp32): output: max error" in out and "(within 0.0001)" in out
    manifest = json.loads((tmp_path / "segments" / "manifest.json").read_text())
    assert manifest["toolchain"]["name"] == "openvino"
    assert (tmp_path / "segments" / "01_nna.xml").is_file() and (tmp_path / "segments" / "01_nna.bin").is_file()
    for entry in (e for e in manifest["segments"] if e["device"] == "nna"):  # the manifest says what the file takes
        declared = onnx.load(tmp_path / "segments" / entry["file"]).graph.input
        assert {v["name"]: v["type"] for v in entry["inputs"]} == {v.name: describe_type(v.type) for v in declared}
        assert any(v["type"].startswith("int32[") for v in entry["inputs"])


def calibration_frames(model, count=3):
    return [example_inputs(model, np.random.default_rng(100 + i), active=150) for i in range(count)]


@pytest.mark.parametrize("name,layout,combine,bits", [
    ("onnxruntime", "image", "gather", 8), ("onnxruntime", "rows", "matmul", 8), ("openvino", "image", "gather", 8),
    ("rknn", "rows", "matmul", 8), ("onnxruntime", "image", "gather", 16), ("openvino", "rows", "gather", 16),
    ("tvm", "image", "gather", 16)])
def test_int8_segments_stay_within_two_percent(name, layout, combine, bits, tmp_path):
    available(name)
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    lowered = sparse_lower.lower(model, target="nna", combine=combine, max_active=1200, layout=layout)
    parts = sparse_lower.partition(lowered)
    compiled = compile_partition(parts, name, tmp_path, calibration=calibration_frames(model), activation_bits=bits)
    assert compiled.manifest["toolchain"]["precision"] == {8: "int8", 16: "w8a16"}[bits]
    feeds = example_inputs(model, np.random.default_rng(7), active=150)  # not a calibration frame
    expected, got = whole(lowered, feeds), CompiledPartition(tmp_path).run(feeds)
    errors = {output: relative_error(got[output], value) for output, value in expected.items()}
    assert max(errors.values()) <= 2e-2, errors
    assert max(errors.values()) > 1e-5, "really int8"
    if name != "rknn":  # QDQ: the middle layer's products in int8, the first and last layer's float
        segment = onnx.load(tmp_path / "01_nna.onnx")
        dequantized = {n.output[0] for n in segment.graph.node if n.op_type == "DequantizeLinear"}
        quantized = {n.name.split("/")[0] for n in segment.graph.node
                     if n.op_type in ("Conv", "MatMul") and n.input[0] in dequantized}
        assert quantized == {"submanifoldconv2"}
        assert segment_quantized_type(segment) == {8: TensorProto.INT8, 16: TensorProto.INT16}[bits]


def test_openvino_int8_is_right_on_cpus_without_vnni(tmp_path):
    """OpenVINO's int8 on a CPU without VNNI (forced here with oneDNN's ISA cap) sums u8·s8 pairs in 16 bits,
    which saturate with 8-bit weights; its segments take 7-bit weights and come out as in onnxruntime."""
    available("openvino")
    network = MODELS[0]
    lowered = sparse_lower.lower(network.model, target="nna", max_active=network.capacity)
    frames = [example_inputs(network.model, np.random.default_rng(100 + i), active=network.active) for i in range(4)]
    compile_partition(sparse_lower.partition(lowered), "openvino", tmp_path / "ov", calibration=frames[:3])
    compile_partition(sparse_lower.partition(lowered), "onnxruntime", tmp_path / "ort", calibration=frames[:3])
    segment = onnx.load(tmp_path / "ov" / "01_nna.onnx")
    codes = [onnx.numpy_helper.to_array(t) for t in segment.graph.initializer if t.data_type == TensorProto.INT8
             and t.dims and len(t.dims) > 1]
    assert codes and max(int(np.abs(c).max()) for c in codes) <= 64
    np.savez(tmp_path / "frame.npz", **frames[3])
    script = ("import sys, numpy as np; from sparse_lower.toolchains import CompiledPartition; "
              "out = CompiledPartition(sys.argv[1]).run(dict(np.load(sys.argv[2]))); "
              "np.save(sys.argv[3], next(iter(out.values())))")
    for isa in ("AVX2", "AVX512_CORE_VNNI"):
        subprocess.run([sys.executable, "-c", script, str(tmp_path / "ov"), str(tmp_path / "frame.npz"),
                        str(tmp_path / f"{isa}.npy")], check=True, env={**os.environ, "ONEDNN_MAX_CPU_ISA": isa})
    expected = next(iter(whole(lowered, frames[3]).values()))
    for isa in ("AVX2", "AVX512_CORE_VNNI"):
        assert relative_error(np.load(tmp_path / f"{isa}.npy"), expected) <= 2e-2, isa


def segment_quantized_type(segment):
    """The element type activations are quantized to: that of the QuantizeLinear zero points."""
    zero_points = {n.input[2] for n in segment.graph.node if n.op_type == "QuantizeLinear"}
    return {t.data_type for t in segment.graph.initializer if t.name in zero_points}.pop()


def test_rknn_refuses_16_bit_activations_on_the_rk3588(tmp_path):
    available("rknn")
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    parts = sparse_lower.partition(sparse_lower.lower(model, target="nna", combine="matmul", max_active=1200,
                                                      layout="rows"))
    with pytest.raises(SparseLowerError, match="8-bit activations only"):
        compile_partition(parts, "rknn", tmp_path, calibration=calibration_frames(model), activation_bits=16)


def test_rknn_keeps_the_first_last_and_wide_layers_in_float16(tmp_path):
    """rknn's hybrid quantization: the layers the plan widens (and the first and last) named to it in
    float16, each tensor their ops write, the rest int8; within 2 % on a frame outside calibration."""
    available("rknn")
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    lowered = sparse_lower.lower(model, target="nna", combine="matmul", max_active=1200, layout="rows")
    compiled = compile_partition(sparse_lower.partition(lowered), "rknn", tmp_path,
                                 calibration=calibration_frames(model), wide_layers=["submanifoldconv2"])
    assert compiled.manifest["toolchain"]["wide_layers"] == ["submanifoldconv2"]
    config = (tmp_path / "01_nna.quantization.cfg").read_text()
    listed = config[:config.index("quantize_parameters:")]
    float16 = re.findall(r'^    "([^"]+)": float16$', listed, re.M)
    assert {name.split("/")[0] for name in float16} >= {"submanifoldconv0", "submanifoldconv2", "sparseconv4"}
    feeds = example_inputs(model, np.random.default_rng(7), active=150)
    expected, got = whole(lowered, feeds), CompiledPartition(tmp_path).run(feeds)
    assert 1e-5 < max(relative_error(got[name], value) for name, value in expected.items()) <= 2e-2


# ops of rknn-toolkit2 2.5.0's rewritten head stack (hybrid_quantization_step1's .model): (op, name, outputs)
RKNN_REWRITTEN = [
    ("exDataConvert", "features/paired/padded__cvt_float32_to_int8", ["features/paired/padded_int8"]),
    ("Conv", "submanifoldconv0/tap0/MatMul#2", ["submanifoldconv0/tap0/partial_mm"]),
    ("exMatMul", "submanifoldconv0/tap0/MatMul_1#1", ["submanifoldconv0/tap1/sum-rs"]),
    ("Add", "submanifoldconv0/Add", ["submanifoldconv0/biased-rs"]),
    ("Relu", "relu1/Relu", ["relu1/padded-rs"]),
    ("Transpose", "relu1/padded_tp#26", ["relu1/padded_tp#26-rs"]),
    ("Mul", "submanifoldconv2/Mul", ["submanifoldconv2/bias_columns-rs"]),
    ("Conv", "submanifoldconv2/tap0/MatMul#2", ["submanifoldconv2/tap0/partial_mm"]),
    ("Transpose", "submanifoldconv2/tap0/partial_mm_tp", ["submanifoldconv2/tap0/partial_mm_tp"]),
    ("exMatMul", "submanifoldconv2/tap0/MatMul_1#1", ["submanifoldconv2/tap1/sum-rs"]),
    ("Add", "submanifoldconv2/Add", ["submanifoldconv2/biased-rs"]),
    ("Relu", "relu3/Relu", ["relu3/padded-rs"]),
    ("Transpose", "relu3/padded_tp#26", ["relu3/padded_tp#26-rs"]),
    ("Conv", "sparseconv4/tap0/MatMul#2", ["sparseconv4/tap0/partial_mm"]),
    ("Split", "sparseconv4/nbr/padded/tap0/Gather_2sl_2sp", ["sparseconv4/nbr/padded/tap0/Gather_2sl-rs"]),
]


def test_rknn_finds_a_layers_tensors_between_layers_under_the_names_it_derives_from_ours():
    """A wide layer's float16 list reaches what it reads (the previous ReLU's padded rows, as rknn
    renamed them) and what it writes through its bias and activation, and nothing of the other layers."""
    lowered = sparse_lower.lower(centerpoint_head_stack(spatial_shape=(10, 40, 40)), target="nna",
                                 combine="matmul", max_active=1200, layout="rows")
    rewritten = helper.make_model(helper.make_graph(
        [helper.make_node(op, [], outputs, name=name) for op, name, outputs in RKNN_REWRITTEN], "rknn", [], []))
    products = {p for p in weight_products(lowered) if p.startswith("submanifoldconv2/")}
    kept = layer_tensors(lowered, products) | {
        output for node in lowered.graph.node if node.name.startswith("submanifoldconv2/") for output in node.output}
    assert derived_tensors(rewritten, lowered, kept) == [
        "relu1/padded-rs", "relu1/padded_tp#26-rs", "submanifoldconv2/bias_columns-rs",
        "submanifoldconv2/tap0/partial_mm", "submanifoldconv2/tap0/partial_mm_tp", "submanifoldconv2/tap1/sum-rs",
        "submanifoldconv2/biased-rs", "relu3/padded-rs", "relu3/padded_tp#26-rs"]


@pytest.mark.parametrize("combine", ["scatter", "matmul"])
def test_openvino_refuses_16_bit_activations_where_it_combines_rows_wrong(combine, tmp_path):
    available("openvino")
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    parts = sparse_lower.partition(sparse_lower.lower(model, target="nna", combine=combine, max_active=1200,
                                                      layout="rows"))
    with pytest.raises(SparseLowerError, match="combine wrong with int16 activations"):
        compile_partition(parts, "openvino", tmp_path, calibration=calibration_frames(model), activation_bits=16)


def test_the_command_line_quantizes_with_16_bit_activations(tmp_path, capsys):
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    onnx.save(sparse_lower.lower(model, target="nna", max_active=1200), tmp_path / "heads.nna.onnx")
    frames = []
    for i, feeds in enumerate([*calibration_frames(model), example_inputs(model, np.random.default_rng(7), active=150)]):
        np.savez(tmp_path / f"frame{i}.npz", **feeds)
        frames.append(str(tmp_path / f"frame{i}.npz"))
    command = ["partition", str(tmp_path / "heads.nna.onnx"), "--out-dir", str(tmp_path / "w8a16"), "--for", "onnxruntime"]
    assert main([*command, "--calibrate", *frames[:3], "--activation-bits", "16", "--inputs", frames[3]]) == 0
    out = capsys.readouterr().out
    assert "run (onnxruntime, float on 2 of 3 layers, w8a16 on 1):" in out and "(within 0.02)" in out, out
    assert main([*command, "--activation-bits", "16"]) == 2
    assert "--activation-bits quantizes" in capsys.readouterr().err


def patent_stack_frames(count=3):
    network = MODELS[3]  # the patent 2-D stack: two quantized layers between its float first and last
    # frames on which widening either layer lowers the error, as the search assumes (not every draw does)
    return network, [example_inputs(network.model, np.random.default_rng(600 + i), active=network.active)
                     for i in range(count)]


def test_mixed_precision_widens_the_most_sensitive_layers_until_the_limit(tmp_path):
    network, frames = patent_stack_frames()
    lowered = sparse_lower.lower(network.model, target="nna", max_active=network.capacity, layout="rows")
    parts = sparse_lower.partition(lowered)
    nothing = choose_wide_layers(parts, frames, limit=1.0)
    assert nothing.wide == [] and len(nothing.errors) == 1
    assert list(nothing.sensitivity) == ["subm0", "subm1"] or list(nothing.sensitivity) == ["subm1", "subm0"]
    assert list(nothing.sensitivity.values()) == sorted(nothing.sensitivity.values(), reverse=True)
    everything = choose_wide_layers(parts, frames, limit=0.0)  # unreachable: every layer widened, in rank order
    assert everything.wide == list(nothing.sensitivity) and len(everything.errors) == 3
    assert everything.errors[0] == nothing.errors[0]
    one = choose_wide_layers(parts, frames, limit=(everything.errors[0] + everything.errors[1]) / 2)
    assert one.wide == everything.wide[:1] and one.errors == everything.errors[:2]

    def outputs(directory, **options):
        compiled = compile_partition(parts, "onnxruntime", tmp_path / directory, calibration=frames, **options)
        return compiled, [compiled.run(feeds) for feeds in frames]

    expected = [whole(lowered, feeds) for feeds in frames]
    mixed, got = outputs("mixed", wide_layers=one.wide)
    assert mixed.manifest["toolchain"]["wide_layers"] == one.wide
    assert max(relative_error(g[n], e[n]) for g, e in zip(got, expected) for n in e) == pytest.approx(one.errors[-1])
    segment = onnx.load(tmp_path / "mixed" / "01_nna.onnx")
    stored = {t.name: t.data_type for t in segment.graph.initializer}
    producer = {n.output[0]: n for n in segment.graph.node}
    widths = {n.name.split("/")[0]: stored[producer[n.input[0]].input[2]] for n in segment.graph.node
              if n.op_type == "MatMul" and getattr(producer.get(n.input[0]), "op_type", "") == "DequantizeLinear"}
    assert widths == {one.wide[0]: TensorProto.INT16, everything.wide[1]: TensorProto.INT8}
    # every layer wide is int16 activations everywhere, to the bit
    assert mixed.manifest["toolchain"]["layers"] == {one.wide[0]: "w8a16", everything.wide[1]: "w8a8"}
    all_compiled, all_wide = outputs("all", wide_layers=everything.wide)
    assert all_compiled.precision_said == "w8a16 on 2 of 2 layers"
    _, w8a16 = outputs("w8a16", activation_bits=16)
    assert all(np.array_equal(a[n], b[n]) for a, b in zip(all_wide, w8a16) for n in a)


def test_the_old_name_of_the_search_still_works_with_a_warning():
    sys.modules.pop("sparse_lower.toolchains.mixed_precision", None)
    with pytest.warns(DeprecationWarning, match="use sparse_lower.quantization"):
        old = importlib.import_module("sparse_lower.toolchains.mixed_precision")
    assert old.Plan is sparse_lower.quantization.Plan
    network, frames = patent_stack_frames(1)
    parts = sparse_lower.partition(sparse_lower.lower(network.model, target="nna", max_active=network.capacity,
                                                      layout="rows"))
    assert old.choose_wide_layers(parts, frames, limit=1.0, chain=toolchain("onnxruntime")).wide == []


def test_wide_layers_are_checked(tmp_path):
    network, frames = patent_stack_frames(1)
    parts = sparse_lower.partition(sparse_lower.lower(network.model, target="nna", max_active=network.capacity,
                                                      layout="rows"))
    with pytest.raises(SparseLowerError,
                       match=r"wide_layers names \['conv9'\], which are no layers.*fix: name some of .*subm0, subm1"):
        compile_partition(parts, "onnxruntime", tmp_path, calibration=frames, wide_layers=["subm0", "conv9"])
    with pytest.raises(SparseLowerError, match="wide_layers widens quantized layers.*fix: pass calibration"):
        compile_partition(parts, "onnxruntime", tmp_path, wide_layers=["subm0"])


def test_the_command_line_chooses_the_wide_layers(tmp_path, capsys, monkeypatch):
    """`partition --calibrate … --wide-layers auto`: the search's run of the calibration frames serves the
    compile too (compile_partition never runs them again)."""
    network, frames = patent_stack_frames()
    onnx.save(sparse_lower.lower(network.model, target="nna", max_active=network.capacity, layout="rows"),
              tmp_path / "stack.nna.onnx")
    paths = []
    for i, feeds in enumerate(frames):
        np.savez(tmp_path / f"frame{i}.npz", **feeds)
        paths.append(str(tmp_path / f"frame{i}.npz"))
    command = ["partition", str(tmp_path / "stack.nna.onnx"), "--out-dir", str(tmp_path / "mixed"),
               "--for", "onnxruntime"]

    def again(*args):
        raise AssertionError("the calibration frames were run a second time")
    monkeypatch.setattr("sparse_lower.toolchains.runner.segment_samples", again)
    assert main([*command, "--calibrate", *paths, "--wide-layers", "auto", "--inputs", paths[0]]) == 0
    out = capsys.readouterr().out
    assert re.search(r"wide layers \(16-bit activations\): (none|subm\d(,subm\d)?), \d of 2; the calibration frames "
                     r"within [\d.]+ % in onnxruntime", out), out
    assert "(within 0.02)" in out
    assert main([*command, "--wide-layers", "subm0"]) == 2
    assert "--wide-layers quantizes" in capsys.readouterr().err


def test_activations_quantize_to_8_or_16_bits(tmp_path):
    parts = sparse_lower.partition(sparse_lower.lower(MODELS[0].model, target="nna", max_active=1700))
    with pytest.raises(SparseLowerError, match="activation_bits=4"):
        compile_partition(parts, "onnxruntime", tmp_path, calibration=calibration_frames(MODELS[0].model),
                          activation_bits=4)
    with pytest.raises(SparseLowerError, match="needs calibration frames"):
        compile_partition(parts, "onnxruntime", tmp_path, activation_bits=16)


def test_ranges_computed_once_quantize_like_ranges_computed_per_call():
    """A study (docs/toolchains.md, int8) quantizes one segment many ways from ranges over all its products."""
    model = MODELS[0].model
    parts = sparse_lower.partition(sparse_lower.lower(model, target="nna", max_active=1700))
    (index,) = [s.index for s in parts.segments if s.device == "nna"]
    segment, samples = parts.segment_model(index), segment_samples(parts, calibration_frames(model))[index]
    products = weight_products(segment)
    ranges = activation_ranges(segment, samples, products)
    for bits in (8, 16):
        assert (quantize_qdq(segment, samples, set(products[1:]), bits, ranges).SerializeToString()
                == quantize_qdq(segment, samples, set(products[1:]), bits).SerializeToString())


def test_the_first_and_last_layers_are_found_on_the_data_flow():
    lowered = sparse_lower.lower(centerpoint_head_stack(spatial_shape=(10, 40, 40)), target="nna", max_active=1200,
                                 fuse_taps=True)
    assert ({name.split("/")[0] for name in first_and_last_products(NodeGraph(lowered))}
            == {"submanifoldconv0", "sparseconv4"})
    assert len(weight_products(lowered)) == 3


def index_segment():
    """A segment whose int64 input `columns` feeds only a Gather's indices, and `shift` also an Add."""
    nodes = [helper.make_node("Gather", ["x", "columns"], ["g"], axis=0),
             helper.make_node("Gather", ["x", "shift"], ["h"], axis=0),
             helper.make_node("Add", ["shift", "shift"], ["twice"]),
             helper.make_node("Add", ["g", "h"], ["y"])]
    graph = helper.make_graph(nodes, "segment", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 2]),
                                                 helper.make_tensor_value_info("columns", TensorProto.INT64, [3]),
                                                 helper.make_tensor_value_info("shift", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2]),
                               helper.make_tensor_value_info("twice", TensorProto.INT64, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def test_index_inputs_read_only_as_indices_become_int32():
    model = index_segment()
    assert narrowable_inputs(model) == ["columns"]
    prepared = prepare(model)
    types = {v.name: v.type.tensor_type.elem_type for v in prepared.graph.input}
    assert types == {"x": TensorProto.FLOAT, "columns": TensorProto.INT32, "shift": TensorProto.INT64}
    assert model.graph.input[1].type.tensor_type.elem_type == TensorProto.INT64, "the original is kept"
    arrays = fed(prepared, {"x": np.ones((5, 2), np.float32), "columns": np.array([0, 4, 2]), "shift": np.zeros(3)})
    assert arrays["columns"].dtype == np.int32 and arrays["shift"].dtype == np.int64
    with pytest.raises(SparseLowerError, match="index input 'columns' holds 0..4294967296, outside int32"):
        fed(prepared, {"x": np.ones((5, 2), np.float32), "columns": np.array([0, 2 ** 32, 1]), "shift": np.zeros(3)})


def test_dynamic_accelerator_segments_and_unknown_toolchains_are_refused(tmp_path):
    _, model, _, _ = MODELS[0]
    with pytest.raises(SparseLowerError,
                       match="unknown toolchain 'tensorrt'.*fix: use one of onnxruntime, openvino, tvm, rknn, tflite, qnn"):
        toolchain("tensorrt")
    available("openvino")
    parts = sparse_lower.partition(sparse_lower.lower(model, target="nna"), static_shapes=False)
    with pytest.raises(SparseLowerError,
                       match="accelerator segment 1 has the dynamic input .*fix: lower with max_active"):
        compile_partition(parts, "openvino", tmp_path)
    with pytest.raises(SparseLowerError, match="holds no compiled partition"):
        sparse_lower.partition(sparse_lower.lower(model, target="gpu")).to_onnx(tmp_path / "plain")
        CompiledPartition(tmp_path / "plain")


def test_a_missing_toolchain_names_its_extra(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *args: None)
    assert toolchain("onnxruntime").missing() is None, "a dependency of sparse_lower"
    for name in set(TOOLCHAINS) - {"onnxruntime"}:
        assert f"pip install 'sparse-lower[{name}]'" in toolchain(name).missing()
