"""The gpu compute form per conv: lower(layer_strategies=...), sparse_lower.tune (each conv timed in every
form on the frames, a faster form kept only where the whole model gets faster), convert --tune and what
inspect prints of it. Timings are the machine's: the tests check what tune does with them, not their size."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import sparse_lower
from sparse_lower.cli.main import main
from sparse_lower.errors import SparseLowerError
from sparse_lower.models import CanonicalEmitter, sparse_unet
from sparse_lower.model_io import recorded_options
from sparse_lower.tuning import FORMS, MARGIN
from sparse_lower.verify import example_inputs

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


def test_convert_tune_says_what_it_measured_and_inspect_what_it_chose(tmp_path, capsys):
    onnx.save(UNET, tmp_path / "unet.onnx")
    for i, feeds in enumerate(frames()):
        np.savez(tmp_path / f"f{i}.npz", **feeds)
    out = tmp_path / "unet.tuned.onnx"
    assert main(["convert", str(tmp_path / "unet.onnx"), "-o", str(out), "--tune", str(tmp_path / "f0.npz"),
                 str(tmp_path / "f1.npz"), "-v"]) == 0
    printed = capsys.readouterr().out
    assert "fused ms" in printed and "rulebook ms" in printed and "tune: " in printed and "verify: ok" in printed
    chosen = recorded_options(onnx.load(out)).get("layer_strategies")
    assert main(["inspect", str(out)]) == 0
    said = capsys.readouterr().out
    assert ("compute form chosen per conv (convert --tune)" in said) == bool(chosen)
    if chosen:
        assert all(f"{conv} {form}" in said for conv, form in chosen.items()), said
    assert main(["convert", str(tmp_path / "unet.onnx"), "-o", str(out), "--tune", str(tmp_path / "f0.npz"),
                 "--strategy", "unfold"]) == 2
    assert "--tune chooses the gpu target's compute form per conv" in capsys.readouterr().err
