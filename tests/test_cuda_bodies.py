"""The CUDA kernels' bodies (custom_ops/cuda/bodies/), run on the host by the emulated library behind the
same C ABI and launch sequences as the GPU (custom_ops/cuda/algorithms.h), against the CPU library: the
index arithmetic, the hash table, the tiling of the conv and its epilogue, proven without a GPU.

Index builders, unfold, fold and site index must equal the CPU ops bitwise (the fold adds in the CPU
kernel's order); the float32 conv within float32 rounding (its sums run in the CPU kernel's order too);
the float16 conv against a reference of half-rounded inputs. Refused inputs give the CPU library's
message. tools/gpu_check.py runs the same comparisons with the CUDA library on a GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest

import custom_op_reference as ref
import sparse_lower
from conftest import DATA
from custom_op_runs import (assert_same, coords_for, index_shape, int8_conv_inputs, output_extent, random_coords,
                            random_geometry, random_index, random_shape, run)
from helpers import chain_model, load_tool, session, voxelnext_like
from oracle import random_sparse
from sparse_lower.cuda_kernels import Kernels
from sparse_lower.errors import SparseLowerError
from sparse_lower.models.samples import centerpoint_head_stack

SEEDS = range(30)
MODELS = Path(__file__).resolve().parents[1] / "models"
BACKEND_ENV = "SPARSE_LOWER_KERNELS"  # "cuda": these tests on a GPU, through the CUDA library (tools/gpu_check.py)


class OnHost:
    """The CUDA library's kernels, their results copied to the host."""

    def __init__(self, kernels: Kernels):
        self.kernels, self.backend = kernels, kernels.backend

    def __getattr__(self, name):
        import cupy

        method = getattr(self.kernels, name)

        def on_host(*args, **kwargs):
            result = method(*args, **kwargs)
            if result is None:  # defer_checks, report
                return None
            return tuple(map(cupy.asnumpy, result)) if isinstance(result, tuple) else cupy.asnumpy(result)
        return on_host


@pytest.fixture(scope="module")
def kernels():
    if os.environ.get(BACKEND_ENV) == "cuda":
        return OnHost(Kernels.cuda())
    built = Kernels.emulated()
    assert built.backend == "emulated"
    return built


# ----------------------------------------------------------------------------------------------------
# Index builders


@pytest.mark.parametrize("source", ["rows", "dense"])
@pytest.mark.parametrize("seed", SEEDS)
def test_submanifold_map(kernels, seed, source):
    rng = np.random.default_rng(seed)
    attributes = random_geometry(rng, "submanifold")
    coords = coords_for(rng, seed, attributes["spatial_shape"])
    (want,) = run("SubmanifoldMap", {"coords": coords}, 1, source=source, **attributes)
    assert_same(kernels.submanifold_map(coords, source=source, **attributes), want)


@pytest.mark.parametrize("op_type, kind", [("StridedMap", "strided"), ("TransposedMap", "transposed")])
@pytest.mark.parametrize("source", ["rows", "dense"])
@pytest.mark.parametrize("seed", SEEDS)
def test_maps_with_output_coords(kernels, seed, source, op_type, kind):
    rng = np.random.default_rng(seed)
    attributes = random_geometry(rng, kind)
    coords = coords_for(rng, seed, attributes["spatial_shape"])
    want_coords, want_nbr = run(op_type, {"coords": coords}, 2, source=source, **attributes)
    out_coords, nbr = kernels.reached_map(op_type, coords, source=source, **attributes)
    assert_same(out_coords, want_coords)
    assert_same(nbr, want_nbr)


@pytest.mark.parametrize("kind", ["transposed", "strided"])  # strided: transposed=0, the floor rule's table
@pytest.mark.parametrize("source", ["rows", "dense"])
@pytest.mark.parametrize("seed", SEEDS)
def test_target_map(kernels, seed, source, kind):
    rng = np.random.default_rng(seed)
    attributes = random_geometry(rng, kind)
    if kind == "strided":
        attributes["transposed"] = 0
    batch = int(rng.integers(1, 4))
    coords = random_coords(rng, attributes["spatial_shape"], batch, 0 if seed % 10 == 0 else None)
    targets = random_coords(rng, output_extent(kind, attributes), batch, 0 if seed % 10 == 5 else None)
    (want,) = run("TargetMap", {"coords": coords, "target_coords": targets}, 1, source=source, **attributes)
    assert_same(kernels.target_map(coords, targets, source=source, **attributes), want)


@pytest.mark.parametrize("seed", SEEDS)
def test_site_index(kernels, seed):
    rng = np.random.default_rng(seed)
    spatial_shape = random_geometry(rng, "submanifold")["spatial_shape"]
    batch_size = int(rng.integers(1, 4))
    coords = random_coords(rng, spatial_shape, batch_size, 0 if seed % 10 == 0 else None)
    (want,) = run("SiteIndex", {"coords": coords}, 1, spatial_shape=spatial_shape, batch_size=batch_size)
    assert_same(kernels.site_index(coords, spatial_shape, batch_size), want)


@pytest.mark.parametrize("seed", SEEDS)
def test_site_order(kernels, seed):
    rng = np.random.default_rng(seed)
    spatial_shape = random_geometry(rng, "submanifold")["spatial_shape"]
    coords = random_coords(rng, spatial_shape, int(rng.integers(1, 4)), 0 if seed % 10 == 0 else None)
    want = run("SiteOrder", {"coords": coords}, 3, spatial_shape=spatial_shape)
    for got, expected in zip(kernels.site_order(coords, spatial_shape), want, strict=True):
        assert_same(got, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_active_sites(kernels, seed):
    rng = np.random.default_rng(seed)
    spatial_shape = random_geometry(rng, "submanifold")["spatial_shape"]
    shape = (int(rng.integers(0 if seed % 10 == 0 else 1, 4)), int(rng.integers(0 if seed % 10 == 1 else 1, 5)),
             *spatial_shape)
    x = rng.standard_normal(shape).astype(np.float32)
    x[rng.random(shape) < 0.85] = 0.0
    x[rng.random(shape) < 0.01] = np.nan  # non-zero: active
    want_coords, want_sites = run("ActiveSites", {"X": x}, 2)
    coords, sites = kernels.active_sites(x)
    assert_same(coords, want_coords)
    assert_same(sites, want_sites)


def frame_coords(name: str) -> np.ndarray:
    path = DATA / f"nuscenes_{name}_voxels.npz"
    if not path.is_file():
        pytest.skip(f"no {path}")
    return np.load(path)["coords"].astype(np.int64)


@pytest.mark.parametrize("frame", ["centerpoint", "bevfusion"])
def test_the_backbones_maps_on_the_real_frames(kernels, frame):
    """CenterPoint's kernel maps on the real frame (41×1440×1440, coords as read): the submanifold map,
    the first strided conv and its inverse onto the frame's own sites."""
    coords = frame_coords(frame)
    grid = [41, 1440, 1440]
    subm = {"kernel_shape": [3, 3, 3], "spatial_shape": grid}
    (want,) = run("SubmanifoldMap", {"coords": coords}, 1, **subm)
    assert_same(kernels.submanifold_map(coords, **subm), want)
    strided = {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1], "dilations": [1, 1, 1],
               "spatial_shape": grid}
    want_coords, want_nbr = run("StridedMap", {"coords": coords}, 2, **strided)
    out_coords, nbr = kernels.reached_map("StridedMap", coords, **strided)
    assert_same(out_coords, want_coords)
    assert_same(nbr, want_nbr)
    inverse = {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1],
               "output_padding": [0, 1, 1], "spatial_shape": output_extent("strided", strided)}
    (want,) = run("TargetMap", {"coords": out_coords, "target_coords": coords}, 1, **inverse)
    assert_same(kernels.target_map(out_coords, coords, **inverse), want)


def repeating_coords(rng, seed, spatial_shape) -> np.ndarray:
    """Coordinates whose rows repeat sites, as a Coalesce's concatenated levels give them: up to three
    batches, drawn from few distinct sites (none or one row in some cases), in random order."""
    batch = int(rng.integers(1, 4))
    distinct = random_coords(rng, spatial_shape, batch, 0 if seed % 10 == 0 else (1 if seed % 10 == 1 else None))
    if len(distinct) == 0:
        return distinct
    return distinct[rng.integers(0, len(distinct), int(rng.integers(1, 4 * len(distinct) + 2)))]


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_coalesce_map(kernels, seed, fixed):
    """CoalesceMap: the distinct sites sorted, each site's rows in input order, as many columns as the
    fullest site has or as attribute `members` fixes."""
    rng = np.random.default_rng(seed)
    spatial_shape = random_geometry(rng, "submanifold")["spatial_shape"]
    coords = repeating_coords(rng, seed, spatial_shape)
    attributes = {"spatial_shape": spatial_shape}
    if fixed:
        attributes["members"] = int(np.unique(coords, axis=0, return_counts=True)[1].max(initial=1)) + seed % 3
    want_coords, want_members = run("CoalesceMap", {"coords": coords}, 2, **attributes)
    out_coords, members = kernels.coalesce_map(coords, **attributes)
    assert_same(out_coords, want_coords)
    assert_same(members, want_members)


@pytest.mark.parametrize("frame", ["centerpoint", "bevfusion"])
def test_coalesce_map_on_the_real_frames(kernels, frame):
    """VoxelNeXt's bird's-eye merge on the real frame: every voxel's (batch, y, x), z dropped, so that
    the sites of a column of voxels repeat."""
    bev = frame_coords(frame)[:, [0, 2, 3]]
    attributes = {"spatial_shape": [1440, 1440]}
    want_coords, want_members = run("CoalesceMap", {"coords": bev}, 2, **attributes)
    out_coords, members = kernels.coalesce_map(bev, **attributes)
    assert_same(out_coords, want_coords)
    assert_same(members, want_members)
    assert members.shape[1] > 1  # columns of voxels did merge


# ----------------------------------------------------------------------------------------------------
# Data movement


@pytest.mark.parametrize("seed", SEEDS)
def test_indexed_unfold(kernels, seed):
    rng = np.random.default_rng(seed)
    if seed % 2:
        x = rng.standard_normal((0 if seed % 10 == 3 else int(rng.integers(1, 50)), int(rng.integers(1, 9))))
        limit = len(x)
    else:
        spatial_shape = random_geometry(rng, "submanifold")["spatial_shape"]
        x = rng.standard_normal((int(rng.integers(1, 4)), int(rng.integers(1, 6)), *spatial_shape))
        limit = x.shape[0] * ref.volume(spatial_shape)
    x = x.astype(np.float32)
    idx = random_index(rng, limit, index_shape(rng, seed))
    (want,) = run("IndexedUnfold", {"X": x, "idx": idx}, 1)
    assert_same(kernels.unfold(x, idx), want)


@pytest.mark.parametrize("seed", SEEDS)
def test_indexed_fold_rows(kernels, seed):
    rng = np.random.default_rng(seed)
    targets, channels = (0 if seed % 10 == 3 else int(rng.integers(1, 30))), int(rng.integers(1, 9))
    idx = random_index(rng, targets, random_shape(rng, seed, 2))  # repeated targets accumulate
    rows = rng.standard_normal((*idx.shape, channels)).astype(np.float32)
    init = None
    if seed % 3:  # Y starts from a full init or from a bias row
        init = rng.standard_normal((targets, channels) if seed % 3 == 1 else (channels,)).astype(np.float32)
    inputs = {"rows": rows, "idx": idx, "like": np.zeros((targets, 2), np.int64), "init": init}
    (want,) = run("IndexedFold", inputs, 1, mode="rows")
    assert_same(kernels.fold(rows, idx, like_rows=targets, init=init), want)


@pytest.mark.parametrize("seed", SEEDS)
def test_indexed_fold_dense(kernels, seed):
    rng = np.random.default_rng(seed)
    spatial_shape = random_geometry(rng, "submanifold")["spatial_shape"]
    batch_size, channels = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    idx = random_index(rng, batch_size * ref.volume(spatial_shape), random_shape(rng, seed, 2))
    rows = rng.standard_normal((*idx.shape, channels)).astype(np.float32)
    (want,) = run("IndexedFold", {"rows": rows, "idx": idx}, 1, mode="dense", batch_size=batch_size,
                  spatial_shape=spatial_shape)
    assert_same(kernels.fold(rows, idx, spatial_shape=spatial_shape, batch_size=batch_size), want)


# ----------------------------------------------------------------------------------------------------
# The fused conv


def conv_inputs(rng, seed) -> dict:
    """IndexedConv's inputs: up to 300 output rows (several row tiles), channel counts around the 16-wide
    slices and the 64-wide column tiles, taps of uneven fill (a tap no row of a tile has is skipped)."""
    n = 0 if seed % 10 == 3 else int(rng.integers(1, 200))
    m = 0 if seed % 10 == 7 else int(rng.integers(1, 300))
    taps, cin, cout = int(rng.integers(1, 28)), int(rng.integers(0, 40)), int(rng.integers(0, 140))
    idx = random_index(rng, n, (m, taps))
    idx[:, rng.random(taps) < 0.3] = -1
    inputs = {"X": rng.standard_normal((n, cin)).astype(np.float32), "idx": idx,
              "W": rng.standard_normal((taps, cin, cout)).astype(np.float32), "B": None, "coords": None, "R": None}
    if seed % 2:
        inputs["B"] = rng.standard_normal(cout).astype(np.float32)
    if seed % 3 == 0:
        inputs["R"] = rng.standard_normal((m, cout)).astype(np.float32)
    return inputs


def emulated_conv(kernels, inputs, activation, precision="float32", splits=0):
    return kernels.indexed_conv(inputs["X"], inputs["idx"], inputs["W"], inputs["B"], inputs["R"], activation,
                                precision, splits)


def rounded(values: np.ndarray, precision: str) -> np.ndarray:
    """float32 values rounded to float16 or bfloat16 (to nearest, ties to even), as float32."""
    if precision == "float16":
        return values.astype(np.float16).astype(np.float32)
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return bits.view(np.float32)


# Blocks per tile sharing its taps: the library's choice (here, as on an H100/H200, few tiles: a split of
# up to 8), none, and 3 (uneven runs of taps, some of them empty in a tile).
SPLITS = [0, 1, 3]


@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("seed", SEEDS)
def test_indexed_conv_float32(kernels, seed, splits):
    rng = np.random.default_rng(seed)
    inputs = conv_inputs(rng, seed)
    activation = "relu" if seed % 4 == 0 else "none"
    (want,) = run("IndexedConv", inputs, 1, activation=activation)
    got = emulated_conv(kernels, inputs, activation, splits=splits)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(inputs["X"].shape[1], 1))
    again = emulated_conv(kernels, inputs, activation, splits=splits)
    np.testing.assert_array_equal(again.view(np.uint32), got.view(np.uint32))  # the same bits run to run


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("seed", SEEDS)
def test_indexed_conv_on_tensor_cores(kernels, seed, splits, precision):
    """Products of inputs rounded to float16 or bfloat16, summed in float32: as a float64 reference of the
    rounded inputs to float32 rounding (the tensor cores sum in their own order), and within 1e-2 of the
    float32 conv (relative to its largest value)."""
    rng = np.random.default_rng(seed)
    inputs = conv_inputs(rng, seed)
    activation = "relu" if seed % 4 == 0 else "none"
    got = emulated_conv(kernels, inputs, activation, precision, splits)
    want = ref.indexed_conv(rounded(inputs["X"], precision), inputs["idx"], rounded(inputs["W"], precision),
                            inputs["B"], inputs["R"], activation)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(inputs["X"].shape[1], 1))
    (full,) = run("IndexedConv", inputs, 1, activation=activation)
    assert np.abs(got - full).max(initial=0) <= 1e-2 * max(np.abs(full).max(initial=0), 1e-6)


# ----------------------------------------------------------------------------------------------------
# Refusals: the CPU library's messages


def refusal(call) -> str:
    with pytest.raises(SparseLowerError) as raised:
        call()
    return raised.value.reason


def cpu_refusal(*args, **kwargs) -> str:
    with pytest.raises(Exception) as raised:
        run(*args, **kwargs)
    return str(raised.value)


SUBM = {"kernel_shape": [3, 3], "spatial_shape": [5, 6]}


@pytest.mark.parametrize("coords", [
    [[0, 1, 1], [0, 2, 2], [0, 1, 1]],     # a duplicated coordinate
    [[0, 1, 1], [-1, 2, 2]],               # a negative batch
    [[0, 1, 1], [0, 5, 2]],                # outside the grid
], ids=["duplicate", "negative batch", "outside"])
def test_refused_coordinates_get_the_cpu_librarys_message(kernels, coords):
    coords = np.array(coords, np.int64)
    message = refusal(lambda: kernels.submanifold_map(coords, **SUBM))
    assert message in cpu_refusal("SubmanifoldMap", {"coords": coords}, 1, **SUBM), message


@pytest.mark.parametrize("coords, members", [
    ([[0, 1, 1], [0, 2, 2], [0, 1, 1], [1, 0, 0], [0, 2, 2], [0, 2, 2]], 2),   # a site of 3 rows, members = 2
    ([[0, 1, 1], [-1, 2, 2]], 0),                                              # a negative batch
    ([[0, 1, 1], [0, 5, 2]], 0),                                               # outside the grid
], ids=["too many members", "negative batch", "outside"])
def test_refused_coalesce_coordinates_get_the_cpu_librarys_message(kernels, coords, members):
    coords = np.array(coords, np.int64)
    attributes = {"spatial_shape": SUBM["spatial_shape"], "members": members}
    message = refusal(lambda: kernels.coalesce_map(coords, **attributes))
    assert message in cpu_refusal("CoalesceMap", {"coords": coords}, 2, **attributes), message


def test_refused_indices_get_the_cpu_librarys_message(kernels):
    x = np.ones((4, 2), np.float32)
    idx = np.array([[0, 1], [3, 4], [5, -1]], np.int64)
    w = np.ones((2, 2, 3), np.float32)
    message = refusal(lambda: kernels.indexed_conv(x, idx, w))
    assert message == "idx value 4 (row 1, tap 1) is outside [0, 4), the rows of X; only -1 marks a missing input"
    assert message in cpu_refusal("IndexedConv", {"X": x, "idx": idx, "W": w}, 1)
    assert refusal(lambda: kernels.unfold(x, idx)) in cpu_refusal("IndexedUnfold", {"X": x, "idx": idx}, 1)
    rows = np.ones((3, 2, 2), np.float32)
    message = refusal(lambda: kernels.fold(rows, idx, like_rows=4))
    assert message in cpu_refusal("IndexedFold", {"rows": rows, "idx": idx, "like": np.zeros((4, 1))}, 1), message


@pytest.mark.parametrize("change", ["weight", "x_scale", "w_scale", "channels", "index"])
def test_refused_int8_inputs_get_the_cpu_librarys_message(kernels, change):
    rng = np.random.default_rng(1)
    inputs = int8_conv_inputs(rng, 5, 4, 3, 1025 if change == "channels" else 6, 7)
    if change == "weight":
        inputs["W"].flat[17] = -128
    elif change in ("x_scale", "w_scale"):
        inputs[change].flat[-1] = np.inf if change == "x_scale" else 0.0
    elif change == "index":
        inputs["idx"][2, 1] = 5
    message = refusal(lambda: kernels.indexed_conv_int8(inputs["X"], inputs["idx"], inputs["W"], inputs["x_scale"],
                                                        inputs["w_scale"]))
    assert message in cpu_refusal("IndexedConvInt8", inputs, 1), message


# ----------------------------------------------------------------------------------------------------
# Deferred checks: a run reads back nothing but sizes, and reports its first refusal at its end


@pytest.fixture
def deferred(kernels):
    """The kernels with their checks deferred on the current stream, set back after the test."""
    kernels.defer_checks(True)
    try:
        yield kernels
    finally:
        kernels.defer_checks(False)
        kernels.report()  # nothing may be left over for the next test


def bad_calls():
    """(name, call(kernels)) of every kind of refused input, each alone."""
    x, w = np.ones((4, 2), np.float32), np.ones((2, 2, 3), np.float32)
    bad_idx = np.array([[0, 1], [3, 4], [5, -1]], np.int64)
    int8 = int8_conv_inputs(np.random.default_rng(2), 5, 4, 3, 6, 7)
    int8["W"].flat[9] = -128
    scaled = {**int8, "W": int8_conv_inputs(np.random.default_rng(2), 5, 4, 3, 6, 7)["W"]}
    scaled["x_scale"] = scaled["x_scale"].copy()
    scaled["x_scale"][2] = -0.5
    return [
        ("duplicate", lambda k: k.submanifold_map(np.array([[0, 1, 1], [0, 2, 2], [0, 1, 1]]), **SUBM)),
        ("negative batch", lambda k: k.submanifold_map(np.array([[0, 1, 1], [-1, 2, 2]]), **SUBM)),
        ("outside", lambda k: k.reached_map("StridedMap", np.array([[0, 1, 1], [0, 5, 2]]), strides=[2, 2], **SUBM)),
        ("conv index", lambda k: k.indexed_conv(x, bad_idx, w)),
        ("unfold index", lambda k: k.unfold(x, bad_idx)),
        ("fold index", lambda k: k.fold(np.ones((3, 2, 2), np.float32), bad_idx, like_rows=4)),
        ("int8 weight", lambda k: k.indexed_conv_int8(int8["X"], int8["idx"], int8["W"], int8["x_scale"],
                                                      int8["w_scale"])),
        ("int8 scale", lambda k: k.indexed_conv_int8(scaled["X"], scaled["idx"], scaled["W"], scaled["x_scale"],
                                                     scaled["w_scale"])),
        ("coalesce outside", lambda k: k.coalesce_map(np.array([[0, 1, 1], [0, 1, 7]]), SUBM["spatial_shape"])),
    ]


@pytest.mark.parametrize("name, call", bad_calls(), ids=[name for name, _ in bad_calls()])
def test_a_deferred_refusal_has_the_same_message(deferred, name, call):
    """Each kind of refused input, its verdict left on the device: the call returns, and the report raises
    what the call raises when its checks report at once."""
    deferred.defer_checks(False)
    message = refusal(lambda: call(deferred))
    deferred.defer_checks(True)
    call(deferred)  # returns: the verdict stays on the device
    assert refusal(deferred.report) == message
    deferred.report()  # reported once: the record is clear again


def test_deferred_checks_report_the_runs_first_refusal(deferred):
    """Three ops in a run: a map with a refused coordinate, then a conv with a refused index (which runs,
    its bad entry read as missing, never outside X), then a good one; the report names the first."""
    coords = np.array([[0, 1, 1], [-1, 2, 2], [0, 2, 3]], np.int64)
    nbr = deferred.submanifold_map(coords, **SUBM)
    assert nbr.shape == (3, 9)
    x, w = np.ones((3, 2), np.float32), np.ones((9, 2, 4), np.float32)
    idx = np.where(nbr >= 0, nbr, -1)
    idx[0, 4] = 10 ** 12  # far outside X
    y = deferred.indexed_conv(x, idx, w)
    assert y.shape == (3, 4) and np.isfinite(y).all()
    deferred.unfold(x, idx)
    with pytest.raises(SparseLowerError, match=r"row 1 of coords has a negative batch -1"):
        deferred.report()
    good = np.array([[0, 1, 1], [0, 2, 2]], np.int64)
    out_coords, good_nbr = deferred.reached_map("StridedMap", good, strides=[2, 2], **SUBM)
    deferred.report()  # a good run reports nothing, and computes what the checked kernels compute
    deferred.defer_checks(False)
    want_coords, want_nbr = deferred.reached_map("StridedMap", good, strides=[2, 2], **SUBM)
    assert_same(out_coords, want_coords)
    assert_same(good_nbr, want_nbr)


# ----------------------------------------------------------------------------------------------------
# Whole models through the C ABI, as tools/gpu_check.py runs the backbone on a GPU


@pytest.fixture(scope="module")
def kernel_model():
    pytest.importorskip("torch", reason="PyTorch is not installed: pip install '.[spconv]'")
    return load_tool("gpu_check").KernelModel


@pytest.mark.parametrize("name", ["head stack", "dense boundaries", "sparse UNet", "merging network"])
def test_gpu_target_models_run_through_the_kernels(kernels, kernel_model, name):
    """Each custom op of the gpu target's models (maps of every kind, the fused conv with its epilogue,
    ToSparse's ActiveSites and dense unfold, ToDense's SiteIndex and dense fold, VoxelNeXt's CoalesceMap and
    the merge's Gather + Reduce) in sequence, as gpu_check runs them, against the CPU library: float32
    within 1e-5, float16 within 1e-2."""
    rng = np.random.default_rng(4)
    if name == "head stack":
        model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
        features, coords = random_sparse(rng, 2, 5, (10, 40, 40), count=900)
        feeds = {"features": features, "coords": coords}
    elif name == "dense boundaries":
        model = chain_model()
        x = rng.standard_normal((2, 2, 6, 8)).astype(np.float32)
        x[rng.random(x.shape) < 0.6] = 0
        feeds = {"X": x}
    elif name == "merging network":
        model = voxelnext_like(rng)
        features, coords = random_sparse(rng, 2, 2, (9, 10, 11), count=300)
        feeds = {"features": features, "coords": coords}
    else:
        model = onnx.load(MODELS / "sparse_unet.onnx")
        features, coords = random_sparse(rng, 1, 5, (41, 64, 64), count=1500)
        feeds = {"features": features, "coords": coords}
    lowered = sparse_lower.lower(model, target="gpu")
    want = dict(zip([o.name for o in lowered.graph.output], session(lowered).run(None, feeds)))
    import torch

    on_gpu = isinstance(kernels, OnHost)  # the CUDA library: torch tensors on the GPU, CuPy views of them
    device, device_kernels = ("cuda", kernels.kernels) if on_gpu else ("cpu", kernels)
    inputs = {k: torch.as_tensor(v, device=device) for k, v in feeds.items()}
    for precision, tolerance in (("float32", 1e-5), ("float16", 1e-2), ("bfloat16", 1e-2)):
        outputs = kernel_model(lowered, device_kernels, device, precision).graph.run(inputs)
        for (output, value), got in zip(want.items(), outputs):
            got = got.cpu().numpy()
            assert got.shape == value.shape and got.dtype == value.dtype, output
            if value.dtype == np.int64:
                np.testing.assert_array_equal(got, value)
            else:
                assert np.abs(got - value).max(initial=0) <= tolerance * max(np.abs(value).max(initial=0), 1), output


def test_int8_gpu_target_runs_through_the_kernels(kernels, kernel_model):
    """The head stack quantized by sparse_lower.quantize (a float first conv, then IndexedConvInt8) run op
    by op through the kernels, as gpu_check runs it: the same bits as the CPU library's session."""
    rng = np.random.default_rng(5)
    model = centerpoint_head_stack(spatial_shape=(10, 40, 40))
    frames = [dict(zip(("features", "coords"), random_sparse(rng, 1, 5, (10, 40, 40), count=900))) for _ in range(3)]
    quantized, found = sparse_lower.quantize(model, frames[:2])
    assert found.tops  # some convs are 8-bit
    want = session(quantized).run(None, frames[2])
    import torch

    on_gpu = isinstance(kernels, OnHost)
    device, device_kernels = ("cuda", kernels.kernels) if on_gpu else ("cpu", kernels)
    inputs = {k: torch.as_tensor(v, device=device) for k, v in frames[2].items()}
    outputs = kernel_model(quantized, device_kernels, device, "float32").graph.run(inputs)
    for value, got in zip(want, outputs):
        np.testing.assert_array_equal(got.cpu().numpy(), value)
