"""int8 for QNN's HTP (docs/toolchains.md, QNN): the segments' narrow gathers padded as the HTP
quantizes them right (htp_form: the same numbers), every tensor in QDQ form with the wide layers' tensors and weights in
16 bits, the mixed-precision search in that form, and the compiled segments run on the HTP (simulated)
within 2 % of float and as onnxruntime's CPU runs the same file. The HTP runs skip without the `qnn`
extra; the rest needs only onnxruntime."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import sparse_lower
from sparse_lower.models import centerpoint_head_stack, small_networks
from sparse_lower.runtime import create_session
from sparse_lower.toolchains import CompiledPartition, compile_partition, toolchain
from sparse_lower.quantization import QuantizedRuns, choose_wide_layers
from sparse_lower.quantization.calibration import segment_samples
from sparse_lower.quantization.htp import GATHER_COLUMNS, Margins, htp_form, htp_ranges, layer_tensors, with_margins
from sparse_lower.quantization.products import weight_products
from sparse_lower.toolchains.prepare import fed
from sparse_lower.verify import example_inputs, relative_error

HEAD_STACK = centerpoint_head_stack(spatial_shape=(10, 40, 40))


def frames(model, count=3, active=150):
    return [example_inputs(model, np.random.default_rng(100 + i), active=active) for i in range(count)]


def head_stack_parts(combine="unfold"):
    return sparse_lower.partition(sparse_lower.lower(HEAD_STACK, target="nna", combine=combine, max_active=1200,
                                                     layout="rows"))


@pytest.mark.parametrize("case", range(len(small_networks())))
@pytest.mark.parametrize("combine", ["unfold", "gather"])
def test_the_htp_form_computes_the_same_numbers(case, combine):
    network = small_networks()[case]
    parts = sparse_lower.partition(sparse_lower.lower(network.model, target="nna", combine=combine,
                                                      max_active=network.capacity, layout="rows"))
    samples = segment_samples(parts, frames(network.model, 1, network.active))
    (index,) = samples
    segment = parts.segment_model(index)
    form = htp_form(segment)
    onnx.checker.check_model(form, full_check=True)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in onnx.shape_inference.infer_shapes(form).graph.value_info}
    assert weight_products(form) == weight_products(segment)
    gathers = [n for n in form.graph.node if n.op_type == "Gather"]
    assert gathers and all(shapes[n.input[0]][1] >= GATHER_COLUMNS for n in gathers)
    sample = samples[index][0]
    for want, got in zip(create_session(segment).run(None, sample), create_session(form).run(None, sample)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_layer_holds_what_its_product_reads_and_writes():
    parts = head_stack_parts()
    (index,) = [s.index for s in parts.segments if s.device == "nna"]
    form = htp_form(parts.segment_model(index))
    tensors = layer_tensors(form, {"submanifoldconv2/MatMul"})
    assert {"submanifoldconv2/unfolded", "submanifoldconv2/summed", "submanifoldconv2/biased", "relu1/padded"} <= tensors
    assert any(name.startswith("submanifoldconv2/tap") for name in tensors), "its gathered rows"
    assert not any(name.startswith(("sparseconv4/", "submanifoldconv0/")) for name in tensors), "no other layer's"


def test_a_layer_of_the_gather_combine_holds_its_rows_moved_to_their_sites_and_what_follows():
    """The gather combine moves each product's rows to their sites before the sum: the layer's tensors go
    on through that move to its sum, bias and activation (rknn's float16 list is these tensors)."""
    model = sparse_lower.lower(HEAD_STACK, target="nna", combine="gather", max_active=1200, layout="rows")
    tensors = layer_tensors(model, {p for p in weight_products(model) if p.startswith("submanifoldconv2/")})
    assert {"relu1/padded", "submanifoldconv2/tap5/partial", "submanifoldconv2/tap5/moved",
            "submanifoldconv2/tap5/sum", "submanifoldconv2/biased", "relu3/padded"} <= tensors
    assert not any(name.startswith(("sparseconv4/", "submanifoldconv0/")) for name in tensors), "no other layer's"


def test_the_htp_quantized_form_runs_in_onnxruntime_within_two_percent():
    """Every tensor quantized: the middle layer at 8 bits (int8 weights), the first and last (which stay
    float in the other toolchains' form) with 16-bit tensors and weights; checked on a frame not
    calibrated on."""
    parts = head_stack_parts()
    (index,) = [s.index for s in parts.segments if s.device == "nna"]
    segment = parts.segment_model(index)
    calibration = segment_samples(parts, frames(HEAD_STACK))[index]
    edges = {"submanifoldconv0/MatMul", "sparseconv4/MatMul"}
    quantized = toolchain("qnn").int8_form().quantized(segment, calibration, edges)
    types = {t.name: t.data_type for t in quantized.graph.initializer}
    zero_points = {node.input[0].removesuffix("_QuantizeLinear_Output"): types.get(node.input[2])
                   for node in quantized.graph.node if node.op_type == "DequantizeLinear"}
    assert zero_points["submanifoldconv2/unfolded"] == zero_points["submanifoldconv2/summed"] == TensorProto.UINT8
    assert zero_points["submanifoldconv0/unfolded"] == zero_points["submanifoldconv0/summed"] == TensorProto.UINT16
    assert zero_points["submanifoldconv0/W_quantized"] == TensorProto.INT16
    assert zero_points["submanifoldconv2/W_quantized"] == TensorProto.INT8
    dequantized = {node.output[0] for node in quantized.graph.node if node.op_type == "DequantizeLinear"}
    for node in quantized.graph.node:  # the values every op computes on (not a Gather's indices)
        if node.op_type in ("Add", "Concat", "MatMul", "Gather"):
            values = node.input[:1] if node.op_type == "Gather" else node.input
            assert all(name in dequantized or name in types for name in values), node.name
    unseen = segment_samples(parts, [example_inputs(HEAD_STACK, np.random.default_rng(7), active=150)])[index][0]
    want = create_session(segment).run(None, unseen)[0]
    got = create_session(quantized).run(None, fed(quantized, unseen))[0]
    assert 1e-5 < relative_error(got, want) <= 2e-2


def test_margins_widen_each_kind_of_tensor_by_its_own():
    """The features (a segment input products read, and its gathered rows) by `features`, computed tensors
    by `wide` or `narrow` as they are held, the rows' masks not at all; no margins: the ranges as given."""
    parts = head_stack_parts()
    (index,) = [s.index for s in parts.segments if s.device == "nna"]
    form = htp_form(parts.segment_model(index))
    ranges = htp_ranges(form, segment_samples(parts, frames(HEAD_STACK, 1))[index])
    assert with_margins(form, ranges, Margins(), set()) is ranges
    narrow = layer_tensors(form, {"submanifoldconv2/MatMul"}) - layer_tensors(form, {"submanifoldconv0/MatMul"})
    widened = with_margins(form, ranges, Margins(features=1.0, wide=2.0, narrow=3.0), narrow)
    factor = {name: max(abs(widened[name][0]), widened[name][1]) / max(abs(low), high)
              for name, (low, high) in ranges.items() if high > low}
    assert factor["submanifoldconv0/unfolded"] == pytest.approx(2.0)  # the raw features, gathered
    assert factor["submanifoldconv0/summed"] == factor["relu1/padded"] == pytest.approx(3.0)
    assert factor["submanifoldconv2/summed"] == pytest.approx(4.0)
    masks = [name for name in ranges if name.endswith("/mask")]
    assert masks and all(factor[name] == 1.0 for name in masks)


def test_margins_hold_a_frame_beyond_the_calibrated_ranges():
    """A frame whose features reach 3x what calibration saw: MinMax clips every tensor on the way, ranges
    with a margin (16 bits everywhere) hold it."""
    parts = head_stack_parts()
    (index,) = [s.index for s in parts.segments if s.device == "nna"]
    segment = parts.segment_model(index)
    calibration = segment_samples(parts, frames(HEAD_STACK))[index]
    feeds = example_inputs(HEAD_STACK, np.random.default_rng(7), active=150)
    feeds["features"] = 3 * feeds["features"]
    unseen = segment_samples(parts, [feeds])[index][0]
    want = create_session(segment).run(None, unseen)[0]
    everything = set(weight_products(segment))

    def error(margins):
        quantized = replace(toolchain("qnn").int8_form(), margins=margins).quantized(segment, calibration, everything)
        return relative_error(create_session(quantized).run(None, fed(quantized, unseen))[0], want)

    assert error(Margins(features=3.0, wide=3.0)) < 2e-3 < 2e-2 < error(Margins())


def test_the_mixed_precision_search_runs_in_qnns_form():
    """The head stack's middle layer at 8 bits is 0.1-2 % off in QNN's form: within 2 % nothing is
    widened; held to 0.1 % it is widened to 16 bits (16-bit weights too), which holds it."""
    parts = head_stack_parts()
    calibration = frames(HEAD_STACK)
    qnn = toolchain("qnn").int8_form()
    runs = QuantizedRuns(parts, calibration, qnn)
    assert list(runs.layers) == ["submanifoldconv2"]
    at_8_bits = max(runs.errors(["submanifoldconv2"]))
    assert 1e-3 < at_8_bits < 2e-2
    loose = choose_wide_layers(parts, calibration, form=qnn)
    assert loose.wide == [] and loose.errors == [pytest.approx(at_8_bits)]
    strict = choose_wide_layers(parts, calibration, limit=1e-3, form=qnn)
    assert strict.wide == ["submanifoldconv2"] and strict.errors[-1] <= 1e-3 < strict.errors[0]


def test_the_search_measures_frames_outside_calibration():
    """QuantizedRuns(calibration=...): the ranges (and the samples a compile calibrates on) from those
    frames, the errors on the others: a frame measured but not calibrated on is further off (MinMax ranges)."""
    parts = head_stack_parts()
    (index,) = [s.index for s in parts.segments if s.device == "nna"]
    calibration, measured = frames(HEAD_STACK, 2), [example_inputs(HEAD_STACK, np.random.default_rng(7), active=150)]
    qnn = replace(toolchain("qnn").int8_form(), margins=Margins())
    outside = QuantizedRuns(parts, measured, qnn, calibration=calibration)
    inside = QuantizedRuns(parts, measured, qnn)
    assert len(outside.samples[index]) == 2 and len(inside.samples[index]) == 1
    for name, value in segment_samples(parts, calibration)[index][1].items():
        np.testing.assert_array_equal(outside.samples[index][1][name], value)
    layers = list(outside.layers)
    assert outside.errors(layers)[0] > inside.errors(layers)[0]


def test_qnn_int8_runs_on_the_htp_as_on_the_cpu(tmp_path):
    """Wholly on the HTP, within 2 % of float end to end, and what onnxruntime's CPU computes from the
    same QDQ file (the search's measurements hold on the HTP)."""
    chain = toolchain("qnn")
    if chain.missing():
        pytest.skip(chain.missing())
    parts = head_stack_parts()
    compiled = compile_partition(parts, chain, tmp_path, calibration=frames(HEAD_STACK))
    assert compiled.manifest["toolchain"]["precision"] == "int8" and compiled.fallbacks == []
    assert compiled.precision_said == "w16a16 on 2 of 3 layers, w8a8 on 1"  # the first and last 16 bits wide
    feeds = example_inputs(HEAD_STACK, np.random.default_rng(7), active=150)
    lowered = sparse_lower.lower(HEAD_STACK, target="nna", combine="unfold", max_active=1200, layout="rows")
    (output,) = [o.name for o in lowered.graph.output if o.type.tensor_type.elem_type == TensorProto.FLOAT]
    want = create_session(lowered).run([output], feeds)[0]
    assert 1e-5 < relative_error(CompiledPartition(tmp_path).run(feeds)[output], want) <= 2e-2
    (entry,) = [e for e in compiled.manifest["segments"] if e["device"] == "nna"]
    sample = segment_samples(parts, [feeds])[entry["index"]][0]
    model = onnx.load(tmp_path / entry["file"])
    on_cpu = dict(zip([o.name for o in model.graph.output], create_session(model).run(None, fed(model, sample))))
    on_htp = chain.load(tmp_path / entry["artifact"], model)(sample)
    for name, value in on_cpu.items():
        assert relative_error(on_htp[name], value) <= 3e-3, name


def test_the_command_line_quantizes_for_the_htp(tmp_path, capsys):
    """`partition --for qnn --calibrate … --wide-layers auto` on the head stack lowered with
    `--combine unfold`: the plan measured in QNN's form, the segment run on the HTP within 2 %."""
    chain = toolchain("qnn")
    if chain.missing():
        pytest.skip(chain.missing())
    from sparse_lower.cli.main import main

    onnx.save(sparse_lower.lower(HEAD_STACK, target="nna", combine="unfold", max_active=1200, layout="rows"),
              tmp_path / "head.nna.onnx")
    paths = []
    for i, feeds in enumerate(frames(HEAD_STACK)):
        np.savez(tmp_path / f"frame{i}.npz", **feeds)
        paths.append(str(tmp_path / f"frame{i}.npz"))
    assert main(["partition", str(tmp_path / "head.nna.onnx"), "--out-dir", str(tmp_path / "qnn"), "--for", "qnn",
                 "--calibrate", *paths, "--wide-layers", "auto", "--inputs", paths[0]]) == 0
    out = capsys.readouterr().out
    assert "wide layers (16-bit activations): none, 0 of 1" in out
    assert "ops on its HTP" in out and "(within 0.02)" in out, out
