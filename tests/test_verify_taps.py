"""convert's default verification sees every tap: its random sites lie in clusters at every scale (as a
LiDAR frame's do), so a lowering that breaks only the off-centre taps of one first-level convolution fails
the check, and the check reports how many pairs each tap multiplied. Sites drawn uniformly over the
41 × 1440 × 1440 grid had no neighbours: such a lowering passed with an error of 0.0 (issue 71)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import sparse_lower
from helpers import sparse_lower_cli
from sparse_lower.assumed_active import assumed_active
from sparse_lower.cli.convert import DEFAULT_TOLERANCE
from sparse_lower.verify import compare, example_inputs, random_coords, tap_coverage

HEAD = Path(__file__).resolve().parents[1] / "models" / "centerpoint_head.onnx"


def off_centre_zeroed(model: onnx.ModelProto, node_name: str) -> onnx.ModelProto:
    """A copy of `model` whose node `node_name` multiplies its centre tap only: what a lowering that
    mislaid every other tap of that layer would compute."""
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    node = next(n for n in broken.graph.node if n.name == node_name)
    initializer = next(i for i in broken.graph.initializer if i.name == node.input[2])
    weight = numpy_helper.to_array(initializer).copy()
    centre = tuple(k // 2 for k in weight.shape[2:])
    kept = weight[(slice(None), slice(None), *centre)].copy()
    weight[...] = 0
    weight[(slice(None), slice(None), *centre)] = kept
    initializer.CopyFrom(numpy_helper.from_array(weight, initializer.name))
    return broken


@pytest.mark.parametrize("target", ["gpu", "nna"])
@pytest.mark.parametrize("layer", ["submanifoldconv0", "sparseconv4"])
def test_a_lowering_that_breaks_the_off_centre_taps_of_a_first_level_conv_fails_the_default_check(layer, target):
    model = onnx.load(HEAD)
    lowered = sparse_lower.lower(off_centre_zeroed(model, layer), target=target)
    feeds = example_inputs(model, np.random.default_rng(0), active=assumed_active(model))  # convert's defaults
    taps: dict = {}
    worst = max(d.max_rel for d in compare(model, lowered, feeds, taps))
    assert worst > 100 * DEFAULT_TOLERANCE
    assert tap_coverage(taps)[1] and taps[layer].min() > 0


def test_random_sites_have_neighbours_at_every_level():
    coords = random_coords(np.random.default_rng(0), 500, 2, (41, 1440, 1440))
    assert len(np.unique(coords, axis=0)) == 500 and set(coords[:, 0]) == {0, 1}
    for stride in (1, 2, 4, 8):
        level = np.unique(np.concatenate([coords[:, :1], coords[:, 1:] // stride], axis=1), axis=0)
        sites = {tuple(row) for row in level}
        for offset in ([0, 0, 1], [0, 1, 0], [1, 0, 0], [1, 1, 1], [1, -1, -1]):
            assert sum((row[0], *(np.array(row[1:]) + offset)) in sites for row in sites) >= 5, (stride, offset)


def test_convert_reports_the_pairs_each_tap_multiplied(tmp_path):
    result = sparse_lower_cli("convert", str(HEAD), "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    verdict = result.stdout.rstrip().splitlines()[-1]
    assert verdict.startswith("verify: ok (") and "; every tap of the 3 convolutions multiplied neighbour pairs (" \
        in verdict, result.stdout


def test_a_model_without_convolutions_gets_no_coverage_line(tmp_path):
    from onnx import TensorProto, helper

    pool = helper.make_node("SparseMaxPool", ["features", "coords"], ["out", "out_coords"], domain="sparse",
                            name="pool", kernel_shape=[2, 2], strides=[2, 2], spatial_shape=[8, 8])
    graph = helper.make_graph([pool], "pool", [
        helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 3]),
        helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 3])], [
        helper.make_tensor_value_info("out", TensorProto.FLOAT, ["M", 3]),
        helper.make_tensor_value_info("out_coords", TensorProto.INT64, ["M", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("sparse", 1)])
    model.ir_version = 10
    onnx.save(model, tmp_path / "pool.onnx")
    coords = random_coords(np.random.default_rng(0), 30, 2, (8, 8))
    np.savez(tmp_path / "frame.npz", features=np.random.default_rng(1).standard_normal((30, 3)).astype(np.float32),
             coords=coords)
    result = sparse_lower_cli("convert", "pool.onnx", "-o", "out.onnx", "--inputs", "frame.npz", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = result.stdout.rstrip().splitlines()[-1]
    assert verdict.startswith("verify: ok (") and "tap" not in verdict and "verify: ;" not in result.stdout
