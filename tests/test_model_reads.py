"""`convert` reads its model once, whatever it does with it (issue 71): each API function takes "a path or
a model", and convert hands the model it read to every step, so an exporter's 185 MB file is read from
disk once and copied at most once (to spell its default domain ""), with tuning, int8 and verification."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest

from sparse_lower.cli.main import main
from sparse_lower.models import centerpoint_head_stack
from sparse_lower.verify import example_inputs


@pytest.fixture
def counted(monkeypatch):
    counts = collections.Counter()
    load, from_string = onnx.load, onnx.ModelProto.FromString

    def counted_load(*args, **kwargs):
        counts["read"] += 1
        return load(*args, **kwargs)

    def counted_from_string(*args, **kwargs):
        counts["copied"] += 1
        return from_string(*args, **kwargs)

    monkeypatch.setattr(onnx, "load", counted_load)
    monkeypatch.setattr(onnx.ModelProto, "FromString", staticmethod(counted_from_string))
    return counts


@pytest.mark.parametrize("options", [["--tune", "frame.npz", "--int8", "--calibrate", "frame.npz"],
                                     ["--target", "nna", "--max-active", "2000"]])
def test_convert_reads_its_model_once(options, counted, tmp_path, monkeypatch):
    model = centerpoint_head_stack()
    for opset in model.opset_import:  # the default domain spelled "ai.onnx", as some exporters write it
        if opset.domain == "":
            opset.domain = "ai.onnx"
    onnx.save(model, tmp_path / "model.onnx")
    feeds = example_inputs(model, np.random.default_rng(1), active=300)
    np.savez(tmp_path / "frame.npz", **feeds)
    monkeypatch.chdir(tmp_path)
    counted.clear()
    assert main(["convert", "model.onnx", "-o", "out.onnx", "-q", *options]) == 0
    assert counted["read"] == 1 and counted["copied"] <= 1, counted
