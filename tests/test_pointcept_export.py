"""sparse_lower.export of Pointcept's Point Transformer V3 (exporter/pointcept_calls.py): the serialization
codes the graph computes, against the Hilbert curve's own properties and, with a checkout, against
Pointcept's `encode`; the patches of its attention against Pointcept's; the network itself (its layers as
the nuScenes configuration has them, narrower) and Sonata's encoder against Pointcept's module on both real
frames at Pointcept's own grid (its GridSample at 0.05 m, checked against Pointcept's), a frame of another size
and a batch of two, each exported once with the export's defaults, on gpu and portable, and across an
OpenVINO partition; the relative position encoding; the refusal of flash attention.

Pointcept is not on PyPI: $SPARSE_LOWER_POINTCEPT names a checkout (tools/pointcept_networks.py); the
network also needs torch-scatter (`pip install --no-build-isolation torch-scatter==2.1.2`, built from its
source) and addict (`pip install "sparse-lower[pointcept]"`)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason='needs torch: pip install "sparse-lower[spconv]"')
from conftest import DATA  # noqa: E402
from helpers import load_tool, sparse_lower_cli  # noqa: E402
from sparse_lower.errors import SparseLowerError  # noqa: E402
from sparse_lower.exporter import pointcept_calls  # noqa: E402

CHECKOUT = os.environ.get("SPARSE_LOWER_POINTCEPT")
needs_checkout = pytest.mark.skipif(not CHECKOUT, reason="Pointcept's code is read from a checkout: set "
                                    "SPARSE_LOWER_POINTCEPT to a checkout of Pointcept/Pointcept")
needs_scatter = pytest.mark.skipif(__import__("importlib").util.find_spec("torch_scatter") is None,
                                   reason="Pointcept's networks need torch-scatter: pip install --no-build-isolation "
                                          "torch-scatter==2.1.2")
TOOL = load_tool("pointcept_networks")
networks = pytest.importorskip("sparse_lower.checkouts.pointcept")


def cube(depth: int) -> torch.Tensor:
    side = np.arange(2 ** depth)
    return torch.from_numpy(np.stack(np.meshgrid(side, side, side, indexing="ij"), -1).reshape(-1, 3))


def test_z_order_interleaves_the_bits_of_x_y_z():
    coords = torch.from_numpy(np.random.default_rng(0).integers(0, 2 ** 16, (500, 3)))
    expected = np.zeros(len(coords), np.int64)
    for bit in range(16):
        for axis, place in enumerate((2, 1, 0)):
            expected |= ((coords[:, axis].numpy() >> bit) & 1) << (3 * bit + place)
    np.testing.assert_array_equal(pointcept_calls.z_order(coords).numpy(), expected)


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_the_hilbert_code_walks_the_frames_cube_one_step_at_a_time(depth):
    coords = cube(depth)
    codes = pointcept_calls.hilbert(coords).numpy()
    np.testing.assert_array_equal(np.sort(codes), np.arange(8 ** depth))  # every cell once, from 0
    walk = coords.numpy()[np.argsort(codes)]
    assert (walk[0] == 0).all()
    assert (np.abs(np.diff(walk, axis=0)).sum(axis=1) == 1).all()


@needs_checkout
@pytest.mark.parametrize("order", ["z", "z-trans", "hilbert", "hilbert-trans"])
@pytest.mark.parametrize("extent", [5, 100, 1440])
def test_the_codes_order_the_points_as_pointcepts_encode_does(order, extent):
    networks.load_pointcept(Path(CHECKOUT))
    import sys

    structure = sys.modules["pointcept.models.utils.structure"]
    rng = np.random.default_rng(extent)
    coords = torch.from_numpy(np.unique(rng.integers(0, extent, (3000, 3)), axis=0))
    batch = torch.from_numpy(np.sort(rng.integers(0, 3, len(coords))))
    depth = int(coords.max() + 1).bit_length()
    theirs = structure.encode(coords, batch, depth, order=order)
    ours = pointcept_calls.encode(coords, batch, order=order)
    np.testing.assert_array_equal(torch.argsort(ours).numpy(), torch.argsort(theirs).numpy())
    np.testing.assert_array_equal(ours.numpy() & ((1 << 48) - 1), theirs.numpy() & ((1 << (3 * depth)) - 1))


@needs_checkout
@pytest.mark.parametrize("counts", [[700], [129, 300], [128, 128, 5000], [1000, 64, 777]])
def test_the_patches_are_pointcepts(counts):
    module = networks.load_pointcept(Path(CHECKOUT))
    attention = module.SerializedAttention(16, 2, 128, enable_flash=False)
    offset = torch.tensor(np.cumsum(counts))
    point = module.Point(offset=offset)
    attention.patch_size = min(min(counts), attention.patch_size_max)
    pad, unpad, _ = attention.get_padding_and_inverse(point)
    size, ours_pad, ours_unpad = pointcept_calls._patches(point, attention.patch_size_max)
    assert int(size) == attention.patch_size
    np.testing.assert_array_equal(ours_pad.numpy(), pad.numpy())
    np.testing.assert_array_equal(ours_unpad.numpy(), unpad.numpy())


def _pointcept_grid_sample(grid_size: float):
    """Pointcept's own GridSample from the checkout's pointcept/datasets/transform.py (its torchvision import,
    unused by GridSample, stood in for)."""
    import importlib
    import sys
    import types

    networks.load_pointcept(Path(CHECKOUT))
    if "torchvision" not in sys.modules:
        stand_in = types.ModuleType("torchvision")
        stand_in.transforms = types.ModuleType("torchvision.transforms")
        sys.modules.update({"torchvision": stand_in, "torchvision.transforms": stand_in.transforms})
    datasets = types.ModuleType("pointcept.datasets")
    datasets.__path__ = [str(Path(CHECKOUT) / "pointcept" / "datasets")]
    sys.modules.setdefault("pointcept.datasets", datasets)
    return importlib.import_module("pointcept.datasets.transform").GridSample(
        grid_size=grid_size, hash_type="fnv", mode="train", return_grid_coord=True)


@needs_checkout
@pytest.mark.parametrize("frame", ["centerpoint", "bevfusion"])
def test_the_points_are_pointcepts_grid_sample_of_the_frame(frame):
    """What the tests, the bench and the demo feed the point transformers is what Pointcept's nuScenes pipeline
    feeds them: its GridSample at 0.05 m of the metric x, y, z, each frame from its own minimum."""
    features = next(iter(TOOL.frame_cases(DATA, [frame]).values()))
    voxels = np.load(DATA / TOOL.FRAMES[frame])["features"].astype(np.float32)
    ours, coords = networks.grid_sampled(voxels, seed=7)
    np.random.seed(7)
    theirs = _pointcept_grid_sample(networks.GRID_SIZE)({"coord": voxels[:, :3].copy(), "strength": voxels[:, 3:4].copy()})
    np.testing.assert_array_equal(ours[:, :3], theirs["coord"])
    np.testing.assert_array_equal(coords[:, 1:][:, ::-1], theirs["grid_coord"])
    assert features[0][1][:, 1:].max(0).tolist() == coords[:, 1:].max(0).tolist()
    if frame == "centerpoint":  # Pointcept's own grid of the frame (z, y, x), past the 0.075 m one's [41, 1440, 1440]
        assert (coords[:, 1:].max(0) + 1).tolist() == [160, 2104, 1420]


@needs_checkout
@needs_scatter
@pytest.mark.parametrize("name", ["PTv3-small", "Sonata-small"])
def test_the_point_transformers_match_pointcept_on_the_real_frames(name):
    assert TOOL.check(Path(CHECKOUT), name, DATA, list(TOOL.FRAMES), ["gpu", "portable"]) <= TOOL.TOLERANCE


@needs_checkout
@needs_scatter
def test_relative_position_encoding_exports():
    import sparse_lower

    module = networks.build(Path(CHECKOUT), "PTv3-small-rpe")
    frame = next(iter(TOOL.frame_cases(DATA, ["bevfusion"]).values()))
    parts = [(frame[0][0][:3000], frame[0][1][:3000])]
    model = networks.export(module, parts)
    feeds = {key: value.numpy() for key, value in networks.point_input(parts).items()}
    expected = networks.run_module(module, parts)
    got = sparse_lower.create_session(sparse_lower.lower(model, target="portable")).run(None, feeds)[0]
    assert np.abs(got - expected).max() <= TOOL.TOLERANCE * np.abs(expected).max()


@needs_checkout
@needs_scatter
def test_one_frame_runs_across_the_openvino_partition():
    pytest.importorskip("openvino", reason='needs OpenVINO: pip install "sparse-lower[openvino]"')
    assert TOOL.check(Path(CHECKOUT), "PTv3-small", DATA, ["bevfusion"], ["openvino"]) <= TOOL.TOLERANCE


@needs_checkout
@needs_scatter
def test_flash_attention_is_refused_naming_the_call():
    module = networks.build(Path(CHECKOUT), "PTv3-small")
    for m in module.modules():
        if type(m).__name__ == "SerializedAttention":
            m.enable_flash = True  # as a model built where flash-attn is installed
    frame = TOOL.frame_cases(DATA, list(TOOL.FRAMES))
    with pytest.raises(SparseLowerError, match="flash_attn_varlen_qkvpacked_func.*enable_flash=False"):
        networks.export(module, [(part[0][:2000], part[1][:2000]) for part in next(iter(frame.values()))])


def test_the_demo_without_a_checkout_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARSE_LOWER_POINTCEPT", raising=False)
    done = sparse_lower_cli("demo", "--model", "ptv3", "--repeat", "1", cwd=tmp_path)
    assert done.returncode != 0
    assert "SPARSE_LOWER_POINTCEPT" in done.stderr and "torch-scatter" in done.stderr


@needs_checkout
@needs_scatter
def test_the_demo_runs_ptv3_on_a_real_frame_and_checks_it(tmp_path):
    done = sparse_lower_cli("demo", "--model", "ptv3", "--data", str(DATA / "nuscenes_bevfusion_voxels.npz"),
                            "--repeat", "1", "--check", "--save-model", "ptv3.onnx", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "max relative error against Pointcept's module in PyTorch" in done.stdout
    assert (tmp_path / "ptv3.onnx").stat().st_size > 0
