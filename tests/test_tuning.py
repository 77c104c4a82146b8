"""The gpu compute form per conv: lower(layer_strategies=...), sparse_lower.tune (each conv timed in every
form on the frames, a faster form kept only where the whole model gets faster; with calibration frames
8 bits too, within an error limit), convert --tune and what inspect prints of it. Timings are the
machine's: the tests check what tune does with them, not their size."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import sparse_lower
from sparse_lower.cli.main import main
from sparse_lower.errors import SparseLowerError
from sparse_lower.models import CanonicalEmitter, sparse_unet
from sparse_lower.model_io import recorded_options
from sparse_lower import tuning
from sparse_lower.tuning import FORMS, GAIN, INT8, MARGIN
from sparse_lower.verify import example_inputs, relative_error

UNET = sparse_unet(CanonicalEmitter(), np.random.default_rng(0), spatial_shape=(16, 48, 48))


def frames(count=2):
    return [example_inputs(UNET, np.random.default_rng(i), active=1500) for i in range(count)]


def ops_of(model, layer):
    return {n.op_type for n in model.graph.node if n.name.split("/")[0] == layer}


def test_a_conv_takes_the_form_named_for_it_and_the_others_the_strategy():
    lowered = sparse_lower.lower(UNET, layer_strategies={"enc2": "unfold", "dec1": "rulebook"})
    assert "IndexedConv" not in ops_of(lowered, "enc2") and "MatMul" in ops_of(lowered, "enc2")
    assert "IndexedFold" in ops_of(lowered, "dec1") and "IndexedConv" in ops_of(lowered, "enc3")
    assert recorded_options(lowered)["layer_strategies"] == {"enc2": "unfold", "dec1": "rulebook"}
    feeds = frames(1)[0]
    want = sparse_lower.create_session(sparse_lower.lower(UNET)).run(None, feeds)
    for got, expected in zip(sparse_lower.create_session(lowered).run(None, feeds), want):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chosen, message", [
    ({"nowhere": "unfold"}, "'nowhere', which is not a sparse conv of the model"),
    ({"enc2": "fastest"}, "unknown strategy of 'enc2' 'fastest'")])
def test_layer_strategies_are_checked(chosen, message):
    with pytest.raises(SparseLowerError, match=message):
        sparse_lower.lower(UNET, layer_strategies=chosen)
    with pytest.raises(SparseLowerError, match="target 'nna' has none"):
        sparse_lower.lower(UNET, target="nna", max_active=2000, layer_strategies={"enc2": "unfold"})


def test_tune_times_every_conv_in_every_form_and_keeps_only_what_made_the_model_faster():
    steps = []
    tuned, found = sparse_lower.tune(UNET, frames(), repeat=1, log=steps.append)
    convs = [n.name for n in UNET.graph.node if n.op_type in ("SubmanifoldConv", "SparseConv", "SparseDeconv")]
    assert list(found.layer_ms) == convs and all(set(times) == set(FORMS) for times in found.layer_ms.values())
    assert len(steps) == len(found.tried)
    for conv, form in found.choices.items():
        without, with_it = found.tried[f"{conv}: {form}"]
        assert with_it < (1 - MARGIN) * without
    assert recorded_options(tuned).get("layer_strategies") == (found.choices or None)
    feeds = frames(1)[0]
    want = sparse_lower.create_session(sparse_lower.lower(UNET)).run(None, feeds)
    for got, expected in zip(sparse_lower.create_session(tuned).run(None, feeds), want):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(SparseLowerError, match="no frames to tune on"):
        sparse_lower.tune(UNET, [])


def saved(tmp_path, feeds: list[dict]) -> list[str]:
    """UNET as tmp_path/unet.onnx and `feeds` as .npz frames beside it: the frames' paths."""
    onnx.save(UNET, tmp_path / "unet.onnx")
    for i, frame in enumerate(feeds):
        np.savez(tmp_path / f"f{i}.npz", **frame)
    return [str(tmp_path / f"f{i}.npz") for i in range(len(feeds))]


def test_convert_tune_says_what_it_measured_and_inspect_what_it_chose(tmp_path, capsys):
    paths = saved(tmp_path, frames())
    out = tmp_path / "unet.tuned.onnx"
    assert main(["convert", str(tmp_path / "unet.onnx"), "-o", str(out), "--tune", *paths, "-v"]) == 0
    printed = capsys.readouterr().out
    assert "fused ms" in printed and "rulebook ms" in printed and "tune: " in printed and "verify: ok" in printed
    chosen = recorded_options(onnx.load(out)).get("layer_strategies")
    assert main(["inspect", str(out)]) == 0
    said = capsys.readouterr().out
    assert ("compute form chosen per conv (convert --tune)" in said) == bool(chosen)
    if chosen:
        assert all(f"{conv} {form}" in said for conv, form in chosen.items()), said
    assert main(["convert", str(tmp_path / "unet.onnx"), "-o", str(out), "--tune", paths[0], "--strategy", "unfold"]) == 2
    assert "--tune chooses the gpu target's compute form per conv" in capsys.readouterr().err


def int8_frames():
    """UNET's frames with non-negative features: every conv's input rows then take u8 codes."""
    return [{**feeds, "features": np.abs(feeds["features"])} for feeds in frames()]


def quantized_convs(model) -> set[str]:
    return {n.name for n in model.graph.node if n.op_type == "IndexedConvInt8"}


def test_tune_with_calibration_frames_times_8_bits_and_keeps_them_only_where_faster_and_within_the_limit():
    """What tune did with this machine's timings: the convs put at 8 bits ran their kernels GAIN faster
    that way, keep the calibration frames within the limit, and made the whole model MARGIN faster;
    every other fused conv says why it stayed float."""
    tune_on, calibrate_on = int8_frames()
    tuned, found = sparse_lower.tune(UNET, [tune_on], repeat=1, calibration_frames=[calibrate_on], int8_limit=0.05)
    fused = {n.name for n in sparse_lower.lower(UNET, layer_strategies=found.choices).graph.node
             if n.op_type == "IndexedConv"}  # the convs whose form stayed fused: 8 bits is theirs
    assert quantized_convs(tuned) == set(found.int8_convs)
    assert set(found.int8_convs) | set(found.float_convs) == fused and not set(found.int8_convs) & set(found.float_convs)
    assert all(INT8 in found.layer_ms[name.split("/")[0]] for name in fused)
    for name in found.int8_convs:
        times = found.layer_ms[name.split("/")[0]]
        assert times[INT8] <= (1 - GAIN) * times["fused"]
    if found.int8_convs:
        (without, with_it), = [ms for what, ms in found.tried.items() if what.endswith(f": {INT8}")]
        assert with_it < (1 - MARGIN) * without
        want = sparse_lower.create_session(sparse_lower.lower(UNET)).run(None, calibrate_on)
        got = sparse_lower.create_session(tuned).run(None, calibrate_on)
        assert max(relative_error(g, w) for g, w in zip(got, want) if w.dtype.kind == "f") <= 0.05


@pytest.fixture
def timings(monkeypatch):
    """tune's timings made up: every conv's kernels `ms` ms in float, the convs in `fast` at 8 bits a third
    of that; the whole model `whole` ms without and with the trial. So the choice tune makes of them is
    known whatever this machine's speed."""
    fast: set[str] = set()
    whole = [10.0, 10.0]

    def kernel_ms(lowered, frames, threads, repeat):
        quantized = {name.split("/")[0] for name in quantized_convs(lowered)}
        return {n.name: (1.0 if n.name in quantized & fast else 3.0) for n in UNET.graph.node}

    monkeypatch.setattr(tuning, "kernel_ms", kernel_ms)
    monkeypatch.setattr(tuning, "alternating_runs", lambda runs, repeat: dict(zip(runs, whole)))
    return fast, whole


def test_tune_puts_at_8_bits_the_faster_convs_that_made_the_model_faster(timings):
    fast, whole = timings
    fast |= {"enc2", "dec1", "stem"}  # stem reads the raw features: below zero in these frames
    whole[:] = [10.0, 5.0]
    tuned, found = sparse_lower.tune(UNET, frames(1), repeat=1, calibration_frames=frames(1), int8_limit=None)
    assert found.int8_convs == ["enc2/IndexedConv", "dec1/IndexedConv"] and quantized_convs(tuned) == set(found.int8_convs)
    assert found.tried == {"2 convs: int8": [10.0, 5.0]}
    assert "below zero" in found.float_convs["stem/IndexedConv"]
    assert found.float_convs["enc3/IndexedConv"] == "its kernels were not 20% faster at 8 bits on the frames"
    whole[:] = [10.0, 9.9]  # within MARGIN: noise
    tuned, found = sparse_lower.tune(UNET, frames(1), repeat=1, calibration_frames=frames(1))
    assert found.int8_convs == [] and not quantized_convs(tuned)
    assert found.float_convs["enc2/IndexedConv"] == "the whole model was not faster with them at 8 bits"


def test_tune_leaves_float_the_faster_convs_past_the_limit(timings):
    fast, whole = timings
    fast |= {n.name for n in UNET.graph.node}
    whole[:] = [10.0, 5.0]
    calibration = int8_frames()[:1]
    _, alone = sparse_lower.quantize(UNET, calibration, limit=0.0)  # no conv at 8 bits keeps the error 0
    tuned, found = sparse_lower.tune(UNET, frames(1), repeat=1, calibration_frames=calibration, int8_limit=0.0)
    assert found.int8_convs == [] and not quantized_convs(tuned) and not found.tried
    assert all("past 0" in why for why in found.float_convs.values()) and set(found.float_convs) == set(alone.float_convs)


def test_convert_tune_with_int8_says_which_convs_took_8_bits(tmp_path, capsys):
    tune_on, calibrate_on = saved(tmp_path, int8_frames())
    out = tmp_path / "unet.tuned.onnx"
    assert main(["convert", str(tmp_path / "unet.onnx"), "-o", str(out), "--tune", tune_on,
                 "--int8", "--calibrate", calibrate_on, "--int8-limit", "0.05", "-v"]) == 0
    printed = capsys.readouterr().out
    tuned = onnx.load(out)
    at_8_bits = quantized_convs(tuned)
    fused = sum(n.op_type in ("IndexedConv", "IndexedConvInt8") for n in tuned.graph.node)  # the others: another form
    assert "int8 ms" in printed and f"tune: {len(at_8_bits)} conv" in printed
    assert f"int8: {len(at_8_bits)} of {fused} convs in 8 bits" in printed
    assert "max rel error" in printed  # the 8-bit model against the float one on the calibration frame
