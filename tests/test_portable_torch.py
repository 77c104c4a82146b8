"""tools/portable_torch.py runs portable models op by op in PyTorch (how the portable target was timed on
a lent GPU, where no GPU build of an ONNX runtime is installed). Its numbers are only worth something if
each op it maps follows the ONNX spec, so it is checked here on the CPU against onnxruntime: random
convs of every kind and attribute form (2-D/3-D, strides, pads, dilations, transposed, inverse, batch
> 1, empty input), a dense-boundary chain, both forms (dynamic and static)."""

from __future__ import annotations


import numpy as np
import onnxruntime as ort
import pytest

import sparse_lower
from helpers import chain_model, load_tool
from oracle import random_conv_config, sparse_node_model
from sparse_lower import reference
from sparse_lower.runtime import pad_rows

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install '.[spconv]'")


@pytest.fixture(scope="module")
def tool():
    return load_tool("portable_torch")


def both(tool, lowered, feeds) -> None:
    """The torch run of `lowered` equals onnxruntime's, output by output (bitwise for integers)."""
    plain = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    want = plain.run(None, feeds)
    graph = tool.TorchGraph(lowered, "cpu")
    got = graph.run({name: graph._tensor(value) for name, value in feeds.items()})
    assert len(got) == len(want)
    for have, value in zip(got, want):
        have = have.numpy()
        assert have.shape == value.shape and have.dtype == value.dtype
        if value.dtype.kind == "f":
            np.testing.assert_allclose(have, value, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(have, value)


@pytest.mark.parametrize("seed", range(40))
def test_random_convs_match_onnxruntime(tool, seed):
    rng = np.random.default_rng(1000 + seed)
    config = random_conv_config(rng)
    model, _ = sparse_node_model(config.op_type, config.attrs, config.cin, config.cout, config.ndim,
                                 config.with_bias, config.target_coords is not None, rng)
    rows = max(len(config.coords), len(reference.run(model, config.feeds)["out_coords"]), 1) + 3
    for options in ({}, {"max_active": rows, "max_batch": config.batch}):
        lowered = sparse_lower.lower(model, target="portable", **options)
        both(tool, lowered, pad_rows(lowered, config.feeds))


def test_a_dense_boundary_chain_matches_onnxruntime(tool, rng):
    x = rng.standard_normal((2, 2, 6, 8)).astype(np.float32)
    x[rng.random(x.shape) < 0.6] = 0
    both(tool, sparse_lower.lower(chain_model(), target="portable"), {"X": x})


def test_an_op_it_does_not_map_is_named(tool):
    model = sparse_lower.lower(chain_model(), target="portable")
    model.graph.node[0].op_type = "Einsum"
    with pytest.raises(SystemExit, match="is not in portable_torch.py's OPS"):
        tool.TorchGraph(model, "cpu")
