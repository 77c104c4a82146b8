"""Nothing is lost in conversion: the lowered model keeps the source's graph inputs and outputs (names,
order, types), its names and documentation, its metadata, and records which version and options made it.
"""

from __future__ import annotations

import json
from importlib.metadata import version

import numpy as np
import onnx
import pytest
from onnx import helper

import sparse_lower
from helpers import run_lowered
from sparse_lower.models import SparseModelBuilder

LOWERINGS = [{"target": "gpu"}, {"target": "gpu", "strategy": "unfold"}, {"target": "nna", "combine": "scatter"},
             {"target": "nna", "max_active": 64, "fuse_taps": True}, {"target": "hybrid"}]


def documented_model() -> onnx.ModelProto:
    """Two sparse layers whose outputs are listed out of node order, with an intermediate tensor among
    them, and every kind of name and metadata a model carries."""
    builder = SparseModelBuilder(2, 3, np.random.default_rng(0))
    builder.conv("SubmanifoldConv", 4, (3, 3), (8, 8)).relu()
    middle = builder.features
    builder.conv("SparseConv", 5, (3, 3), (8, 8), strides=[2, 2])
    model = builder.build("documented")
    final_features, final_coords = list(model.graph.output)
    del model.graph.output[:]
    model.graph.output.extend([final_coords, helper.make_tensor_value_info(middle, onnx.TensorProto.FLOAT, ["N", 4]),
                               final_features])
    model.doc_string = "a model with a story"
    model.graph.doc_string = "the graph's own story"
    model.producer_name, model.producer_version, model.model_version = "exporter", "1.2.3", 7
    helper.set_model_props(model, {"author": "someone", "license": "MIT"})
    return model


@pytest.mark.parametrize("options", LOWERINGS, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_lowering_keeps_interface_names_and_metadata(options):
    source = documented_model()
    lowered = sparse_lower.lower(source, **options)

    def interface(values):
        return [(v.name, v.type.tensor_type.elem_type) for v in values]

    assert interface(lowered.graph.input) == interface(source.graph.input)
    assert interface(lowered.graph.output) == interface(source.graph.output)
    assert (lowered.graph.name, lowered.graph.doc_string, lowered.doc_string) == (
        source.graph.name, source.graph.doc_string, source.doc_string)
    assert (lowered.producer_name, lowered.producer_version, lowered.model_version) == (
        source.producer_name, source.producer_version, source.model_version)
    metadata = {p.key: p.value for p in lowered.metadata_props}
    assert {k: metadata[k] for k in ("author", "license")} == {"author": "someone", "license": "MIT"}
    assert metadata["sparse_lower.version"] == version("sparse-lower")
    recorded = json.loads(metadata["sparse_lower.options"])
    assert {k: recorded[k] for k in options} == options


def test_every_output_is_computed_in_the_source_order():
    source = documented_model()
    features, coords = (np.random.default_rng(1).standard_normal((20, 3)).astype(np.float32),
                        np.stack(np.unravel_index(np.random.default_rng(2).choice(128, 20, replace=False),
                                                  (2, 8, 8)), axis=1).astype(np.int64))
    feeds = {"features": features, "coords": coords}
    expected = sparse_lower.reference.run(source, feeds)
    got = run_lowered(source, feeds)
    assert list(got) == list(expected)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5, err_msg=name)
