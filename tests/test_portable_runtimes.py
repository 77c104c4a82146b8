"""The portable target's models in the runtimes they are made for, on both real nuScenes frames: NVIDIA's
exptool file (CenterPoint's backbone), the sparse UNet (strided and inverse convs) and an Autoware encoder
on the real grid, each lowered dynamic and static (a capacity per level; the Autoware encoder's `.dense()`,
a ScatterND, is read as ToDense, which leaves the static form's padding rows out), run by onnxruntime with no
library registered, by OpenVINO (the whole model, CPU plugin) and by TVM (Relax, llvm), and compared with
the expected outputs: spconv's for the NVIDIA file, the gpu target's (itself checked against spconv in
test_wild and test_autoware) for the others.

TVM builds both forms: the dynamic form's run-time sizes are written the way its importer follows them
(docs/portable.md: Where it runs).
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

import sparse_lower
from autoware_graphs import encoder
from conftest import DATA
from helpers import runner, session
from oracle import random_sparse
from sparse_lower.models.samples import small_networks
from sparse_lower.runtime import drop_padding, pad_rows

FRAMES = ("centerpoint", "bevfusion")
MODELS_DIR = Path(__file__).resolve().parents[1] / "models"
NVIDIA = DATA / "wild" / "nvidia_exptool" / "centerpoint.scn.onnx"
# Capacities per level holding both real frames' sites, with a margin (a strided conv can make more sites
# than it reads: the UNet's first one turns BEVFusion's 17,748 voxels into more than 20,000).
LEVELS = {"nvidia": (80_000, 70_000, 30_000, 11_000, 9_000), "unet": (80_000, 70_000, 30_000),
          "autoware": (80_000, 70_000)}
RUNTIMES = ("onnxruntime", "openvino", "tvm")


@functools.lru_cache(maxsize=None)
def frame(name: str) -> tuple[np.ndarray, np.ndarray]:
    path = DATA / f"nuscenes_{name}_voxels.npz"
    if not path.is_file():
        pytest.skip(f"no {path}")
    data = np.load(path)
    return data["features"].astype(np.float32), data["coords"].astype(np.int64)


@functools.lru_cache(maxsize=None)
def source(name: str) -> tuple[onnx.ModelProto, str]:
    """The source-op model and the name of its feature input."""
    if name == "nvidia":
        if not NVIDIA.is_file():
            pytest.skip(f"no {NVIDIA}")
        return sparse_lower.import_model(NVIDIA), "0"
    if name == "unet":
        return onnx.load(MODELS_DIR / "sparse_unet.onnx"), "features"
    graph = encoder("direct", np.random.default_rng(7), grid=(41, 1440, 1440), cin=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sparse_lower.import_model(graph.model), "voxel_features"


def feeds(name: str, frame_name: str) -> dict:
    features, coords = frame(frame_name)
    model, feature_input = source(name)
    value = next(v for v in model.graph.input if v.name != feature_input)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)  # Autoware's coors: int32
    return {feature_input: features, value.name: coords.astype(dtype)}


@functools.lru_cache(maxsize=None)
def expected(name: str, frame_name: str) -> dict:
    if name == "nvidia":
        (output,) = [o.name for o in source(name)[0].graph.output]
        return {output: np.load(NVIDIA.with_name("centerpoint.scn.expected.npz"))[frame_name]}
    lowered = sparse_lower.lower(source(name)[0], target="gpu")
    run = session(lowered, threads=0)
    return dict(zip([o.name for o in run.get_outputs()], run.run(None, feeds(name, frame_name))))


def rows_by_site(features: np.ndarray, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort(coords.T[::-1])
    return features[order], coords[order]


@pytest.mark.parametrize("form", ["dynamic", "static"])
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", ["nvidia", "unet", "autoware"])
def test_the_portable_model_matches_the_expected_outputs_on_both_real_frames(name, runtime, form, tmp_path):
    lowered = sparse_lower.lower(source(name)[0], target="portable",
                                 max_active=LEVELS[name] if form == "static" else None)
    run = runner(runtime, lowered, tmp_path)
    for frame_name in FRAMES:
        got = drop_padding(run(pad_rows(lowered, feeds(name, frame_name))))
        want = expected(name, frame_name)
        assert list(got) == list(want)
        coords = [n for n, v in want.items() if v.dtype == np.int64]
        for output, value in want.items():
            if output in coords:
                continue
            have = got[output]
            if coords:  # rows: compare by site (the runtimes keep the order, the check does not rely on it)
                value, want_coords = rows_by_site(value, want[coords[0]])
                have, have_coords = rows_by_site(have, got[coords[0]])
                np.testing.assert_array_equal(have_coords, want_coords)
            assert have.shape == value.shape, (name, runtime, form, frame_name)
            error = np.abs(have.astype(np.float64) - value).max() / max(np.abs(value).max(), 1e-12)
            assert error <= 1e-4, (name, runtime, form, frame_name, error)


@pytest.mark.parametrize("network", small_networks(), ids=lambda n: n.name)
def test_tvm_builds_the_dynamic_form_of_every_layer_kind(network, tmp_path):
    """One model built by TVM takes frames of any row count: the sites it was run at, one row, none."""
    lowered = sparse_lower.lower(network.model, target="portable")
    run = runner("tvm", lowered, tmp_path)
    plain = session(lowered, threads=0)
    inputs = {v.name: v.type.tensor_type.shape.dim for v in lowered.graph.input}
    grid = next(a.ints for n in network.model.graph.node for a in n.attribute if a.name == "spatial_shape")
    rng = np.random.default_rng(5)
    for count in (network.active, 1, 0):
        features, coords = random_sparse(rng, 2, inputs["features"][1].dim_value, tuple(grid), count=count)
        given = {"features": features, "coords": coords}
        want = dict(zip([o.name for o in plain.get_outputs()], plain.run(None, given)))
        got = run(given)
        for name, value in want.items():
            assert got[name].shape == value.shape, (network.name, count, name)
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)
