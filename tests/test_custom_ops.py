"""The custom-op library (custom_ops/) against its NumPy reference (tests/custom_op_reference.py).

Every op runs alone in a one-node model through ``sparse_lower.runtime.create_session`` over many random
geometries, on empty inputs, with 1, 2 and 8 intra-op threads (results must be bitwise identical), and
on invalid inputs, which must raise an error naming the op and the problem.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import custom_op_reference as ref
from custom_op_runs import (ELEMENT_TYPES, assert_same, conv_cases, coords_for, index_shape, int8_conv_inputs, op_model,
                            output_extent, random_coords, random_geometry, random_index, random_shape, run, session)
from sparse_lower.runtime import create_session, get_library_path, vector_units

SEEDS = range(30)


# ----------------------------------------------------------------------------------------------------
# Index builders


@pytest.mark.parametrize("source", ["rows", "dense"])
@pytest.mark.parametrize("seed", SEEDS)
def test_submanifold_map(seed, source):
    rng = np.random.default_rng(seed)
    attributes = random_geometry(rng, "submanifold")
    coords = coords_for(rng, seed, attributes["spatial_shape"])
    (nbr,) = run("SubmanifoldMap", {"coords": coords}, 1, source=source, **attributes)
    assert_same(nbr, ref.submanifold_map(coords, source=source, **attributes))


@pytest.mark.parametrize("op_type, kind, reference", [("StridedMap", "strided", ref.strided_map),
                                                       ("TransposedMap", "transposed", ref.transposed_map)])
@pytest.mark.parametrize("source", ["rows", "dense"])
@pytest.mark.parametrize("seed", SEEDS)
def test_maps_with_output_coords(seed, source, op_type, kind, reference):
    rng = np.random.default_rng(seed)
    attributes = random_geometry(rng, kind)
    coords = coords_for(rng, seed, attributes["spatial_shape"])
    out_coords, nbr = run(op_type, {"coords": coords}, 2, source=source, **attributes)
    expected_coords, expected_nbr = reference(coords, source=source, **attributes)
    assert_same(out_coords, expected_coords)
    assert_same(nbr, expected_nbr)


# The two ways the maps find their outputs and the two ways their geometry lists taps: an output grid of
# one bit per site where it is small against the inputs (every random geometry above), per-tap lists of
# the reached sites where it is not; the taps of every coordinate listed at construction, or computed per
# point where an extent passes 2^20.
@pytest.mark.parametrize("op_type, kind, reference", [("StridedMap", "strided", ref.strided_map),
                                                       ("TransposedMap", "transposed", ref.transposed_map)])
@pytest.mark.parametrize("spatial_shape, count", [([2 ** 21, 9, 7], 60),  # lists, taps computed
                                                  ([300, 310, 290], 80),  # lists, taps listed
                                                  ([2 ** 21], 3000)])  # bits, taps computed
def test_maps_on_large_grids(spatial_shape, count, op_type, kind, reference):
    rng = np.random.default_rng(count)
    rows = rng.integers(0, spatial_shape, size=(count, len(spatial_shape)))
    coords = np.unique(np.concatenate([rng.integers(0, 2, (count, 1)), rows], axis=1), axis=0)
    coords = coords[rng.permutation(len(coords))].astype(np.int64)
    dims = len(spatial_shape)
    attributes = {"spatial_shape": spatial_shape, "kernel_shape": [3] * dims, "strides": [2] * dims,
                  "pads": [1] * (2 * dims), "dilations": [1] * dims}
    if kind == "transposed":
        attributes = {**attributes, "pads": [0] * (2 * dims), "kernel_shape": [2] * dims}
    out_coords, nbr = run(op_type, {"coords": coords}, 2, threads=2, **attributes)
    expected_coords, expected_nbr = reference(coords, **attributes)
    assert_same(out_coords, expected_coords)
    assert_same(nbr, expected_nbr)


# LineNeighbours takes the rows of one grid line together, in groups of at most 4096 sites along
# x: lines longer than that, with gaps and runs of neighbours, several groups on one line, dilated taps
# crossing a group's edge, 1, 2 and 3 dimensions, and a kernel line wider than a group (a lookup per tap).
@pytest.mark.parametrize("spatial_shape, kernel_shape, dilations", [([3, 2, 20000], [3, 3, 3], [1, 1, 1]),
                                                                    ([2, 30000], [3, 5], [1, 3]),
                                                                    ([50000], [7], [2]),
                                                                    ([40000], [3], [2500])])
def test_submanifold_map_on_long_lines(spatial_shape, kernel_shape, dilations):
    rng = np.random.default_rng(len(spatial_shape))
    starts = rng.integers(0, spatial_shape[-1] - 40, 400)
    runs = [np.arange(start, start + int(rng.integers(1, 40))) for start in starts]
    x = np.unique(np.concatenate([*runs, rng.integers(0, spatial_shape[-1], 3000)]))
    lines = rng.integers(0, [2, *spatial_shape[:-1]], (len(x), len(spatial_shape)))
    coords = np.unique(np.concatenate([lines, x[:, None]], axis=1), axis=0)
    coords = coords[rng.permutation(len(coords))].astype(np.int64)
    attributes = {"spatial_shape": spatial_shape, "kernel_shape": kernel_shape, "dilations": dilations}
    for threads in (1, 2):
        (nbr,) = run("SubmanifoldMap", {"coords": coords}, 1, threads=threads, **attributes)
        assert_same(nbr, ref.submanifold_map(coords, **attributes))


def test_maps_without_popcnt():
    """The site bits counted without POPCNT (the library routine an x86-64 CPU without it runs, forced by
    SPARSE_LOWER_PORTABLE_KERNELS in a fresh process: the library reads it once) against the reference,
    as the POPCNT loops are in this process."""
    script = ("import test_custom_ops as t\n"
              "for seed in t.SEEDS:\n"
              "    for case in [('StridedMap', 'strided', t.ref.strided_map), "
              "('TransposedMap', 'transposed', t.ref.transposed_map)]:\n"
              "        t.test_maps_with_output_coords(seed, 'rows', *case)\n"
              "        t.test_maps_on_large_grids([2 ** 21], 3000, *case)\n")
    env = {**os.environ, "SPARSE_LOWER_PORTABLE_KERNELS": "1"}
    subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent, env=env, check=True)


@pytest.mark.parametrize("kind", ["transposed", "strided"])  # strided: transposed=0, the floor rule's table
@pytest.mark.parametrize("source", ["rows", "dense"])
@pytest.mark.parametrize("seed", SEEDS)
def test_target_map(seed, source, kind):
    rng = np.random.default_rng(seed)
    attributes = random_geometry(rng, kind)
    if kind == "strided":
        attributes["transposed"] = 0
    batch = int(rng.integers(1, 4))
    coords = random_coords(rng, attributes["spatial_shape"], batch, 0 if seed % 10 == 0 else None)
    targets = random_coords(rng, output_extent(kind, attributes), batch, 0 if seed % 10 == 5 else None)
    (nbr,) = run("TargetMap", {"coords": coords, "target_coords": targets}, 1, source=source, **attributes)
    assert_same(nbr, ref.target_map(coords, targets, source=source, **attributes))


@pytest.mark.parametrize("seed", SEEDS)
def test_rulebook(seed):
    rng = np.random.default_rng(seed)
    rows, taps = (0 if seed % 10 == 0 else int(rng.integers(1, 60))), int(rng.integers(1, 28))
    fill = rng.random(taps)  # uneven taps, as in real neighbourhoods
    nbr = np.where(rng.random((rows, taps)) < fill, -1, rng.integers(0, 100, (rows, taps))).astype(np.int64)
    groups = int(rng.integers(1, 7))
    skip = sorted({int(k) for k in rng.integers(0, taps, int(rng.integers(0, 3)))})
    attributes = {"groups": groups, **({"skip_taps": skip} if skip else {})}
    outputs = run("Rulebook", {"nbr": nbr}, 3 * groups, **attributes)
    expected = ref.rulebook(nbr, groups, skip)
    for g in range(groups):
        for actual, wanted in zip(outputs[3 * g: 3 * g + 3], expected[g]):
            assert_same(actual, wanted)


def test_rulebook_groups_cut_the_padding():
    """Taps filled 100, 90, 50, 45, 10 %: one group pads all to the fullest, three groups pad little."""
    rows, fill = 200, [1.0, 0.9, 0.5, 0.45, 0.1]
    nbr = np.array([[m if m < f * rows else -1 for f in fill] for m in range(rows)], np.int64)
    single, _, _ = run("Rulebook", {"nbr": nbr}, 3)
    assert single.size == 5 * rows
    outputs = run("Rulebook", {"nbr": nbr}, 9, groups=3)
    assert [list(t) for t in outputs[2::3]] == [[0, 1], [2, 3], [4]]
    assert sum(o.size for o in outputs[0::3]) == 2 * 200 + 2 * 100 + 20


def test_rulebook_of_many_taps_cuts_equal_runs():
    rng = np.random.default_rng(0)
    nbr = np.where(rng.random((3, 1100)) < 0.3, -1, rng.integers(0, 5, (3, 1100))).astype(np.int64)
    outputs = run("Rulebook", {"nbr": nbr}, 9, groups=3)
    for g, wanted in enumerate(ref.rulebook(nbr, 3)):
        for actual, expected in zip(outputs[3 * g: 3 * g + 3], wanted):
            assert_same(actual, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_site_index(seed):
    rng = np.random.default_rng(seed)
    spatial_shape = random_geometry(rng, "submanifold")["spatial_shape"]
    batch_size = int(rng.integers(1, 4))
    coords = random_coords(rng, spatial_shape, batch_size, 0 if seed % 10 == 0 else None)
    (sites,) = run("SiteIndex", {"coords": coords}, 1, spatial_shape=spatial_shape, batch_size=batch_size)
    assert_same(sites, ref.site_index(coords, spatial_shape, batch_size))


@pytest.mark.parametrize("seed", SEEDS)
def test_site_order(seed):
    rng = np.random.default_rng(seed)
    spatial_shape = random_geometry(rng, "submanifold")["spatial_shape"]
    coords = random_coords(rng, spatial_shape, int(rng.integers(1, 4)), 0 if seed % 10 == 0 else None)
    for got, want in zip(run("SiteOrder", {"coords": coords}, 3, spatial_shape=spatial_shape),
                         ref.site_order(coords, spatial_shape), strict=True):
        assert_same(got, want)


@pytest.mark.parametrize("seed", SEEDS)
def test_active_sites(seed):
    rng = np.random.default_rng(seed)
    spatial_shape = random_geometry(rng, "submanifold")["spatial_shape"]
    shape = (int(rng.integers(0 if seed % 10 == 0 else 1, 4)), int(rng.integers(1, 5)), *spatial_shape)
    x = rng.standard_normal(shape).astype(np.float32)
    x[rng.random(shape) < 0.85] = 0.0
    x[rng.random(shape) < 0.05] = -0.0  # zero: inactive
    x[rng.random(shape) < 0.01] = np.nan  # non-zero: active
    coords, sites = run("ActiveSites", {"X": x}, 2)
    expected_coords, expected_sites = ref.active_sites(x)
    assert_same(coords, expected_coords)
    assert_same(sites, expected_sites)


# ----------------------------------------------------------------------------------------------------
# Index tables of the nna target

MAPS = ("submanifold", "strided", "transposed", "target")


def random_table(rng, seed) -> tuple[np.ndarray, int]:
    """nbr [M, K] of the reference map of kind MAPS[seed % 4] on a random geometry, and its input row count
    N. N = 0 for seeds ending in 0 or 3 (every kind once; a target table is then all -1); M = 0 with
    N > 0 for target tables of seeds ending in 7."""
    kind = MAPS[seed % 4]
    attributes = random_geometry(rng, "transposed" if kind == "target" else kind)
    batch = int(rng.integers(1, 4))
    coords = random_coords(rng, attributes["spatial_shape"], batch, 0 if seed % 10 in (0, 3) else None)
    if kind == "submanifold":
        nbr = ref.submanifold_map(coords, **attributes)
    elif kind == "strided":
        _, nbr = ref.strided_map(coords, **attributes)
    elif kind == "transposed":
        _, nbr = ref.transposed_map(coords, **attributes)
    else:
        targets = random_coords(rng, output_extent("transposed", attributes), batch, 0 if seed % 10 == 7 else None)
        nbr = ref.target_map(coords, targets, **attributes)
    return nbr, len(coords)


@pytest.mark.parametrize("seed", SEEDS)
def test_inverse_map(seed):
    rng = np.random.default_rng(seed)
    nbr, n = random_table(rng, seed)
    (inv,) = run("InverseMap", {"nbr": nbr, "like": np.zeros((n, 3), np.float32)}, 1)
    assert_same(inv, ref.inverse_map(nbr, n))


@pytest.mark.parametrize("seed", SEEDS)
def test_scatter_matrices(seed):
    rng = np.random.default_rng(seed)
    nbr, n = random_table(rng, seed)
    (s,) = run("ScatterMatrices", {"nbr": nbr, "like": np.zeros((n,), np.int64)}, 1)
    assert_same(s, ref.scatter_matrices(nbr, n))


@pytest.mark.parametrize("seed", SEEDS)
def test_pair_lists(seed):
    rng = np.random.default_rng(seed)
    nbr, n = random_table(rng, seed)
    like = np.zeros((n, 0), np.int64)
    for got, want in zip(run("PairLists", {"nbr": nbr, "like": like}, 3), ref.pair_lists(nbr, n)):
        assert_same(got, want)
    capacities = [int(c) + int(rng.integers(0, 3)) for c in (nbr >= 0).sum(axis=0)]  # room, and padding
    for got, want in zip(run("PairLists", {"nbr": nbr, "like": like}, 3, capacities=capacities),
                         ref.pair_lists(nbr, n, capacities)):
        assert_same(got, want)


def test_scatter_matrices_at_max_bytes():
    """The limit is inclusive: exactly K·M·N·4 bytes are allowed."""
    nbr = np.array([[0, -1], [-1, 2]], np.int64)
    inputs = {"nbr": nbr, "like": np.zeros((3, 1), np.float32)}
    (s,) = run("ScatterMatrices", inputs, 1, max_bytes=2 * 2 * 3 * 4)
    assert_same(s, ref.scatter_matrices(nbr, 3))


@pytest.mark.parametrize("seed", SEEDS)
def test_capacity_pads(seed):
    rng = np.random.default_rng(seed)
    x = np.zeros(random_shape(rng, seed, 4), rng.choice(list(ELEMENT_TYPES)))
    capacity = len(x) + int(rng.integers(0, 3)) * int(rng.integers(0, 20))  # capacity = N as well
    (pads,) = run("CapacityPads", {"x": x}, 1, capacity=capacity)
    assert_same(pads, ref.capacity_pads(x, capacity))


def test_capacity_pads_feed_a_standard_pad():
    """The layout is the one of ONNX Pad: x grows to `capacity` rows of zeros at the end."""
    x = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    model = op_model("CapacityPads", {"x": x}, 1, capacity=5)
    model.graph.node.append(helper.make_node("Pad", ["x", "output0"], ["padded"]))
    model.graph.output.append(helper.make_empty_tensor_value_info("padded"))
    (_, padded) = create_session(model).run(None, {"x": x})
    assert_same(padded, np.concatenate([x, np.zeros((2, 2, 2), np.float32)]))


# ----------------------------------------------------------------------------------------------------
# Data movement


@pytest.mark.parametrize("seed", SEEDS)
def test_indexed_unfold_rows(seed):
    rng = np.random.default_rng(seed)
    n, channels = (0 if seed % 10 == 3 else int(rng.integers(1, 50))), int(rng.integers(1, 9))
    x = rng.standard_normal((n, channels)).astype(np.float32)
    idx = random_index(rng, n, index_shape(rng, seed))
    inputs = {"X": x, "idx": idx}
    if seed % 2:  # the features/coords pairing check
        inputs["coords"] = random_coords(rng, [64], 1, n)
    (y,) = run("IndexedUnfold", inputs, 1)
    assert_same(y, ref.indexed_unfold(x, idx))


@pytest.mark.parametrize("seed", SEEDS)
def test_indexed_unfold_dense(seed):
    rng = np.random.default_rng(seed)
    spatial_shape = random_geometry(rng, "submanifold")["spatial_shape"]
    x = rng.standard_normal((int(rng.integers(1, 4)), int(rng.integers(1, 6)), *spatial_shape)).astype(np.float32)
    idx = random_index(rng, x.shape[0] * ref.volume(spatial_shape), index_shape(rng, seed))
    checked = {"spatial_shape": spatial_shape} if seed % 2 else {}  # the attribute only checks X's extent
    (y,) = run("IndexedUnfold", {"X": x, "idx": idx}, 1, **checked)
    assert_same(y, ref.indexed_unfold(x, idx, spatial_shape))


@pytest.mark.parametrize("seed", SEEDS)
def test_indexed_fold_rows(seed):
    rng = np.random.default_rng(seed)
    targets, channels = (0 if seed % 10 == 3 else int(rng.integers(1, 30))), int(rng.integers(1, 9))
    idx = random_index(rng, targets, random_shape(rng, seed, 2))  # repeated targets accumulate
    rows = rng.standard_normal((*idx.shape, channels)).astype(np.float32)
    like = np.zeros((targets, 2), np.int64)
    init = {}
    if seed % 3:  # Y starts from a full init or from a bias row
        init = {"init": rng.standard_normal((targets, channels) if seed % 3 == 1 else (channels,)).astype(np.float32)}
    (y,) = run("IndexedFold", {"rows": rows, "idx": idx, "like": like, **init}, 1, mode="rows")
    assert_same(y, ref.indexed_fold(rows, idx, "rows", like_rows=targets, **init))


@pytest.mark.parametrize("seed", SEEDS)
def test_indexed_fold_of_a_rulebook(seed):
    """Rows of ascending targets, as a Rulebook's out_rows: the fold finds them by binary search."""
    rng = np.random.default_rng(seed)
    targets, channels = int(rng.integers(0, 300)), int(rng.integers(1, 9))
    nbr = np.where(rng.random((targets, 9)) < 0.5, -1, rng.integers(0, 50, (targets, 9))).astype(np.int64)
    for in_rows, out_rows, _ in ref.rulebook(nbr, 2):
        rows = rng.standard_normal((*out_rows.shape, channels)).astype(np.float32)
        bias = rng.standard_normal(channels).astype(np.float32)
        inputs = {"rows": rows, "idx": out_rows, "like": nbr, "init": bias}
        (y,) = run("IndexedFold", inputs, 1, threads=int(rng.choice([1, 2, 8])), mode="rows")
        assert_same(y, ref.indexed_fold(rows, out_rows, "rows", like_rows=targets, init=bias))


@pytest.mark.parametrize("seed", SEEDS)
def test_indexed_fold_dense(seed):
    rng = np.random.default_rng(seed)
    spatial_shape = random_geometry(rng, "submanifold")["spatial_shape"]
    batch_size, channels = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    idx = random_index(rng, batch_size * ref.volume(spatial_shape), random_shape(rng, seed, 2))
    rows = rng.standard_normal((*idx.shape, channels)).astype(np.float32)
    (y,) = run("IndexedFold", {"rows": rows, "idx": idx}, 1, mode="dense", batch_size=batch_size,
               spatial_shape=spatial_shape)
    assert_same(y, ref.indexed_fold(rows, idx, "dense", batch_size=batch_size, spatial_shape=spatial_shape))


def test_indexed_fold_dense_sparse_targets():
    """Few entries in a large grid: grouping by sorting rather than counting."""
    rng = np.random.default_rng(0)
    spatial_shape = [41, 144, 144]
    idx = rng.choice(2 * ref.volume(spatial_shape), 300)
    idx = np.concatenate([idx, idx[:100], [-1] * 5]).astype(np.int64)  # repeats accumulate
    rows = rng.standard_normal((len(idx), 3)).astype(np.float32)
    (y,) = run("IndexedFold", {"rows": rows, "idx": idx}, 1, mode="dense", batch_size=2, spatial_shape=spatial_shape)
    assert_same(y, ref.indexed_fold(rows, idx, "dense", batch_size=2, spatial_shape=spatial_shape))


@pytest.mark.parametrize("seed", SEEDS)
def test_indexed_conv(seed):
    """The fused conv against the float64 reference, to float32 rounding: its sums run in another order.
    Up to 700 output rows (several row blocks) and channel counts that need every column tile."""
    rng = np.random.default_rng(seed)
    n = 0 if seed % 10 == 3 else int(rng.integers(1, 200))
    m = 0 if seed % 10 == 7 else int(rng.integers(1, 700))
    taps, cin, cout = int(rng.integers(1, 28)), int(rng.integers(0, 40)), int(rng.integers(0, 70))
    x = rng.standard_normal((n, cin)).astype(np.float32)
    inputs = {"X": x, "idx": random_index(rng, n, (m, taps)),
              "W": rng.standard_normal((taps, cin, cout)).astype(np.float32)}
    if seed % 2:
        inputs["B"] = rng.standard_normal(cout).astype(np.float32)
        if seed % 4 == 1:  # the features/coords pairing check
            inputs["coords"] = random_coords(rng, [256], 1, n)
    if seed % 3 == 0:  # the fused epilogue: a residual, alone or with the ReLU
        inputs = {**inputs, "B": inputs.get("B"), "coords": inputs.get("coords"),
                  "R": rng.standard_normal((m, cout)).astype(np.float32)}
    activation = {0: "relu", 1: "none"}.get(seed % 5, None)
    (y,) = run("IndexedConv", inputs, 1, threads=int(rng.choice([1, 2, 8])),
               **({"activation": activation} if activation else {}))
    expected = ref.indexed_conv(x, inputs["idx"], inputs["W"], inputs.get("B"), inputs.get("R"), activation or "none")
    assert y.dtype == np.float32 and y.shape == expected.shape == (m, cout)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5 * max(cin, 1))


@pytest.mark.parametrize("taps", [63, 64, 65])
def test_indexed_conv_with_the_last_of_64_taps(taps):
    """Up to 64 taps are listed through one 64-bit mask per row (its top bit: tap 63), more the plain way."""
    rng = np.random.default_rng(taps)
    x = rng.standard_normal((9, 3)).astype(np.float32)
    idx = rng.integers(-1, 9, (40, taps)).astype(np.int64)
    idx[:, -1] = rng.integers(0, 9, 40)  # the last tap always present
    w = rng.standard_normal((taps, 3, 5)).astype(np.float32)
    (y,) = run("IndexedConv", {"X": x, "idx": idx, "W": w}, 1)
    np.testing.assert_allclose(y, ref.indexed_conv(x, idx, w), rtol=1e-5, atol=1e-4)
    idx[7, -1] = 9
    with pytest.raises(Exception, match=rf"idx value 9 \(row 7, tap {taps - 1}\) is outside \[0, 9\)"):
        run("IndexedConv", {"X": x, "idx": idx, "W": w}, 1)


@pytest.mark.parametrize("seed", SEEDS)
def test_indexed_conv_int8(seed):
    """The 8-bit conv against the reference: exact integer sums, so the same float32 result but for a
    rare double rounding of the reference's float64 step. Channel counts off whole quads and blocks of 8;
    7- and 8-bit weights."""
    rng = np.random.default_rng(seed)
    n = 0 if seed % 10 == 3 else int(rng.integers(1, 200))
    m = 0 if seed % 10 == 7 else int(rng.integers(1, 700))
    taps, cin, cout = int(rng.integers(1, 28)), int(rng.integers(0, 40)), int(rng.integers(0, 70))
    inputs = int8_conv_inputs(rng, n, m, taps, cin, cout, weight_limit=127 if seed % 4 == 2 else 63)
    if seed % 2:
        inputs["B"] = rng.standard_normal(cout).astype(np.float32)
        if seed % 4 == 1:
            inputs["coords"] = random_coords(rng, [256], 1, n)
    if seed % 3 == 0:
        inputs = {**inputs, "B": inputs.get("B"), "coords": inputs.get("coords"),
                  "R": rng.standard_normal((m, cout)).astype(np.float32)}
    activation = {0: "relu", 1: "none"}.get(seed % 5, None)
    (y,) = run("IndexedConvInt8", inputs, 1, threads=int(rng.choice([1, 2, 8])),
               **({"activation": activation} if activation else {}))
    expected = ref.indexed_conv_int8(inputs["X"], inputs["idx"], inputs["W"], inputs["x_scale"], inputs["w_scale"],
                                     inputs.get("B"), inputs.get("R"), activation or "none")
    assert y.dtype == np.float32 and y.shape == expected.shape == (m, cout)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cin, most", [(1024, 63), (512, 127)])
def test_indexed_conv_int8_sums_the_widest_rows_of_full_codes_exactly(cin, most):
    """The widest input the op takes for 7- and 8-bit weights, every code 255 and every weight ±63 or
    ±127: the largest sums any path forms (16.4 M and 16.6 M, below float's 2^24), in AMX's chunks of 64
    channels, VNNI's quads, NEON's octets or (8 bits on AVX2) the portable loop alike."""
    rng = np.random.default_rng(cin)
    inputs = int8_conv_inputs(rng, 40, 37, 3, cin, 48)
    inputs["X"] = np.full((40, cin), 5.0, np.float32)  # past every channel's top: code 255
    inputs["W"] = (most * rng.choice([-1, 1], (3, cin, 48))).astype(np.int8)
    inputs["W"][:, :, 0] = most  # one column whose sum reaches 255 · most · cin per tap
    (y,) = run("IndexedConvInt8", inputs, 1)
    expected = ref.indexed_conv_int8(inputs["X"], inputs["idx"], inputs["W"], inputs["x_scale"], inputs["w_scale"],
                                     None, None, "none")
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op, attributes", [("IndexedConvInt8", {}), ("IndexedConv", {"precision": "bfloat16"})])
def test_weights_packed_once_from_an_initializer_give_the_bits_of_weights_fed_at_each_call(op, attributes):
    """The convs that pack their weights (AMX's tiles, 8-bit quads) keep an initializer's packing from the
    first call: later calls, on other rows, give the bits of the same weights fed as an input. Weights fed
    as an input are packed at each call: a second call with other weights gives their bits, not the first's."""
    rng = np.random.default_rng(64)
    inputs = int8_conv_inputs(rng, 120, 300, 27, 96, 80)  # 96 channels: the tiles where the CPU has AMX
    if op == "IndexedConv":
        inputs = {"X": inputs["X"], "idx": inputs["idx"],
                  "W": rng.standard_normal(inputs["W"].shape).astype(np.float32)}
    other_w = inputs["W"][::-1].copy()
    model = op_model(op, inputs, 1, **attributes)
    model.graph.initializer.append(onnx.numpy_helper.from_array(inputs["W"], "W"))
    model.graph.input.remove(next(i for i in model.graph.input if i.name == "W"))
    kept = create_session(model)
    fed = session(op, inputs, 1, **attributes)
    for rows in (inputs["X"], inputs["X"][::-1].copy()):
        feeds = {**inputs, "X": rows}
        assert_same(kept.run(None, {k: v for k, v in feeds.items() if k != "W"})[0], fed.run(None, feeds)[0])
    assert_same(fed.run(None, {**inputs, "W": other_w})[0], run(op, {**inputs, "W": other_w}, 1, **attributes)[0])


def _conv_outputs() -> dict:
    """IndexedConvInt8 and IndexedConv on conv_cases' random shapes: {op: [Y, ...]}."""
    outputs = {"IndexedConvInt8": [], "IndexedConv": []}
    for op, inputs in conv_cases(SEEDS):
        outputs[op] += run(op, inputs, 1, threads=1)
    return outputs


def _cpu_flags() -> set:
    info = Path("/proc/cpuinfo")
    return set(info.read_text().split()) if info.is_file() else set()


def test_vector_units_are_the_widest_the_cpu_has():
    """What benchmarks report as the units that ran: AVX-512 (with AMX, or VNNI, for int8) where the CPU
    has it, else AVX2 + FMA."""
    if {"SPARSE_LOWER_NO_AVX512", "SPARSE_LOWER_PORTABLE_KERNELS"} & set(os.environ):
        pytest.skip("the environment narrows the units")
    flags = _cpu_flags()
    avx2 = {"avx2", "fma"} <= flags
    vnni = avx2 and {"avx512f", "avx512bw", "avx512_vnni"} <= flags
    want = ("avx512-amx" if vnni and {"amx_tile", "amx_int8"} <= flags and "SPARSE_LOWER_NO_AMX" not in os.environ
            else "avx512-vnni" if vnni else "avx512" if avx2 and "avx512f" in flags else "avx2" if avx2 else "portable")
    assert vector_units() == want


@pytest.mark.parametrize("narrower, units, same_bits", [
    ("SPARSE_LOWER_NO_AMX", ("avx512-vnni",), ("IndexedConvInt8", "IndexedConv")),
    ("SPARSE_LOWER_NO_AVX512", ("avx2", "portable"), ("IndexedConvInt8", "IndexedConv")),
    ("SPARSE_LOWER_PORTABLE_KERNELS", ("portable",), ("IndexedConvInt8",))])
def test_every_vector_path_gives_the_same_bits(narrower, units, same_bits, tmp_path):
    """The 8-bit conv's sums are exact, so every path gives the same bits; the float conv's AVX-512 tiles
    form each sum by the AVX2 tiles' FMAs in the same order, so those two give the same bits too (the
    portable loop, without FMA, differs in the last bits: test_indexed_conv_portable_kernels). This process
    runs the widest units the CPU has; a fresh one (the library reads the environment once) the path
    `narrower` forces."""
    if narrower == "SPARSE_LOWER_NO_AMX" and vector_units() != "avx512-amx":
        pytest.skip(f"the AMX path needs AMX-TILE and AMX-INT8, which this CPU does not have (units: {vector_units()})")
    script = ("import numpy as np, test_custom_ops as t\n"
              "from sparse_lower.runtime import vector_units\n"
              f"np.savez({str(tmp_path / 'y.npz')!r}, **{{f'{{op}}{{i}}': y for op, ys in t._conv_outputs().items() "
              "for i, y in enumerate(ys)})\n"
              "print(vector_units())\n")
    # From tests/, as test_indexed_conv_portable_kernels runs (the installed package, not the source tree).
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent, env={**os.environ, narrower: "1"},
                          check=True, capture_output=True, text=True)
    assert done.stdout.split()[-1] in units, done.stdout
    narrowed = np.load(tmp_path / "y.npz")
    for op in same_bits:
        for i, y in enumerate(_conv_outputs()[op]):
            np.testing.assert_array_equal(narrowed[f"{op}{i}"], y, err_msg=f"{op} case {i}")


def test_indexed_conv_int8_refusals():
    rng = np.random.default_rng(0)
    good = int8_conv_inputs(rng, 5, 4, 3, 6, 7)
    cases = [({"W": np.full((3, 6, 7), -128, np.int8)},
              r"W must be within \[-127, 127\] with Cin = 6 .*got -128 at flat index 0"),
             ({"x_scale": np.ones(5, np.float32)}, r"x_scale must have shape \[6\], got \[5\]"),
             ({"w_scale": np.zeros((3, 7), np.float32)}, r"w_scale must be finite and positive, got 0")]
    for change, message in cases:
        with pytest.raises(Exception, match=message):
            run("IndexedConvInt8", {**good, **change}, 1)
    wide = int8_conv_inputs(rng, 5, 4, 3, 513, 7)  # past 512 channels 8-bit weights could leave float's 2^24
    wide["W"].flat[5] = 64
    with pytest.raises(Exception, match=r"W must be within \[-63, 63\] with Cin = 513 .*got 64 at flat index 5"):
        run("IndexedConvInt8", wide, 1)


def test_indexed_conv_portable_kernels():
    """The loops that run where AVX2/FMA is missing (aarch64, old x86), forced on this CPU by
    SPARSE_LOWER_PORTABLE_KERNELS in a fresh process: the library reads it once, at first use."""
    script = ("import test_custom_ops as t\n"
              "for seed in t.SEEDS: t.test_indexed_conv(seed); t.test_indexed_conv_int8(seed)\n")
    env = {**os.environ, "SPARSE_LOWER_PORTABLE_KERNELS": "1"}
    # Run from tests/: from the repository root, `import sparse_lower` would find the source tree,
    # which holds no built library, instead of the installed package.
    subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent, env=env, check=True)


# ----------------------------------------------------------------------------------------------------
# Thread-count independence: inputs large enough to be split into many blocks


def _large_cases():
    rng = np.random.default_rng(7)
    grid = [24, 64, 64]
    coords = random_coords(rng, grid, 2, 30000)
    conv = {"kernel_shape": [3, 3, 3], "spatial_shape": grid}
    strided = {**conv, "strides": [2, 2, 2], "pads": [1, 1, 1, 0, 1, 1]}
    transposed = {**conv, "strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1], "output_padding": [1, 1, 1]}
    nbr = ref.submanifold_map(coords, [3, 3, 3], grid)
    x = rng.standard_normal((len(coords), 16)).astype(np.float32)
    dense = np.zeros((2, 4, *grid), np.float32)
    dense[coords[:, 0], :, coords[:, 1], coords[:, 2], coords[:, 3]] = rng.standard_normal((len(coords), 4))
    ((in_rows, out_rows, _),) = ref.rulebook(nbr)
    small = random_coords(rng, [8, 16, 16], 1, 500)  # S [27, 500, 500] is 27 MB
    return {
        "SubmanifoldMap": ({"coords": coords}, 1, conv),
        "StridedMap": ({"coords": coords}, 2, strided),
        "TransposedMap": ({"coords": coords}, 2, transposed),
        "TargetMap": ({"coords": coords, "target_coords": coords}, 1, {**transposed, "source": "dense"}),
        "Rulebook": ({"nbr": nbr}, 12, {"groups": 4, "skip_taps": [13]}),
        "SiteIndex": ({"coords": coords}, 1, {"spatial_shape": grid, "batch_size": 2}),
        "SiteOrder": ({"coords": coords}, 3, {"spatial_shape": grid}),
        "ActiveSites": ({"X": dense}, 2, {}),
        "IndexedUnfold": ({"X": x, "idx": nbr}, 1, {}),
        "IndexedFold": ({"rows": x[in_rows.clip(0)], "idx": out_rows, "like": x, "init": x[0]}, 1, {"mode": "rows"}),
        "IndexedConv": ({"X": x, "idx": nbr, "W": rng.standard_normal((27, 16, 24)).astype(np.float32),
                         "B": rng.standard_normal(24).astype(np.float32)}, 1, {}),
        "InverseMap": ({"nbr": nbr, "like": x}, 1, {}),
        "ScatterMatrices": ({"nbr": ref.submanifold_map(small, [3, 3, 3], [8, 16, 16]), "like": small}, 1, {}),
        "CapacityPads": ({"x": x}, 1, {"capacity": 40000}),
        "PairLists": ({"nbr": nbr, "like": x}, 3, {}),
    }


LARGE = _large_cases()


@pytest.mark.parametrize("op_type", sorted(LARGE))
def test_results_do_not_depend_on_thread_count(op_type):
    inputs, n_outputs, attributes = LARGE[op_type]
    results = [run(op_type, inputs, n_outputs, threads, **attributes) for threads in (1, 2, 8)]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert_same(b, a)


def test_large_cases_match_reference():
    out_coords, nbr = run("StridedMap", *LARGE["StridedMap"][:2], threads=8, **LARGE["StridedMap"][2])
    expected_coords, expected_nbr = ref.strided_map(LARGE["StridedMap"][0]["coords"], **LARGE["StridedMap"][2])
    assert_same(out_coords, expected_coords)
    assert_same(nbr, expected_nbr)
    inputs, _, _ = LARGE["IndexedFold"]
    (y,) = run("IndexedFold", inputs, 1, threads=8, mode="rows")
    assert_same(y, ref.indexed_fold(inputs["rows"], inputs["idx"], "rows", like_rows=len(inputs["like"]),
                                    init=inputs["init"]))
    inputs, n_outputs, attributes = LARGE["Rulebook"]
    tables = run("Rulebook", inputs, n_outputs, threads=8, **attributes)
    for g, expected in enumerate(ref.rulebook(inputs["nbr"], 4, [13])):
        for actual, wanted in zip(tables[3 * g: 3 * g + 3], expected):
            assert_same(actual, wanted)
    for op_type, reference in (("InverseMap", ref.inverse_map), ("ScatterMatrices", ref.scatter_matrices)):
        inputs, _, _ = LARGE[op_type]
        (table,) = run(op_type, inputs, 1, threads=8)
        assert_same(table, reference(inputs["nbr"], len(inputs["like"])))
    inputs, _, _ = LARGE["PairLists"]
    for got, want in zip(run("PairLists", inputs, 3, threads=8), ref.pair_lists(inputs["nbr"], len(inputs["like"]))):
        assert_same(got, want)


def _broken_tables() -> dict:
    """Large tables with faults in several blocks: the one reported is the first in block order (tap, then
    row), whichever thread meets a fault first."""
    inputs = LARGE["InverseMap"][0]
    nbr = inputs["nbr"].copy()
    read = np.flatnonzero(nbr[:, 5] >= 0)
    nbr[read[-1], 5] = nbr[read[0], 5]  # tap 5: an input read twice
    nbr[3, 20] = len(inputs["like"])  # tap 20, an earlier row: out of range
    duplicate = rf"InverseMap: output rows {read[0]} and {read[-1]} both read input row {nbr[read[0], 5]} through tap 5"
    conv = dict(LARGE["IndexedConv"][0])
    conv["idx"] = conv["idx"].copy()
    conv["idx"][[3000, 3], [5, 20]] = [-2, len(conv["X"])]  # the lower row block is reported
    small = dict(LARGE["ScatterMatrices"][0])
    small["nbr"] = small["nbr"].copy()
    small["nbr"][[400, 7], [4, 19]] = -3
    listed = dict(LARGE["PairLists"][0])
    listed["nbr"] = listed["nbr"].copy()
    listed["nbr"][[20000, 9000], [3, 25]] = -4  # rows in two blocks of 4,096: the lower is reported
    return {"InverseMap": ({**inputs, "nbr": nbr}, duplicate),
            "PairLists": (listed, r"PairLists: nbr\[9000, 25\] = -4 is neither -1 nor a row of like"),
            "IndexedConv": (conv, rf"IndexedConv: idx value {len(conv['X'])} \(row 3, tap 20\) is outside"),
            "ScatterMatrices": (small, r"ScatterMatrices: nbr\[400, 4\] = -3 is neither -1 nor a row of like")}


@pytest.mark.parametrize("op_type", ["IndexedConv", "InverseMap", "ScatterMatrices", "PairLists"])
def test_errors_do_not_depend_on_thread_count(op_type):
    inputs, message = _broken_tables()[op_type]
    for threads in (1, 2, 8):
        with pytest.raises(Exception, match=message):
            run(op_type, inputs, 3 if op_type == "PairLists" else 1, threads)


# ----------------------------------------------------------------------------------------------------
# Shape inference


def test_inferred_output_shapes():
    def shapes(op_type, inputs, n_outputs, **attributes):
        return [o.shape for o in session(op_type, inputs, n_outputs, static=True, **attributes).get_outputs()]

    coords = np.zeros((5, 4), np.int64)
    assert shapes("SubmanifoldMap", {"coords": coords}, 1, kernel_shape=[3, 3, 3], spatial_shape=[4, 4, 4]) == [[5, 27]]
    assert shapes("SiteIndex", {"coords": coords}, 1, spatial_shape=[4, 4, 4], batch_size=2) == [[5]]
    assert shapes("SiteOrder", {"coords": coords}, 3, spatial_shape=[4, 4, 4]) == [[5, 4], [5, 1], [5, 1]]
    x, idx = np.zeros((7, 16), np.float32), np.zeros((2, 5, 27), np.int64)
    assert shapes("IndexedUnfold", {"X": x, "idx": idx}, 1) == [[2, 5, 27 * 16]]
    rows = np.zeros((2, 5, 16), np.float32)
    assert shapes("IndexedFold", {"rows": rows, "idx": idx[..., 0], "like": x}, 1, mode="rows") == [[7, 16]]
    assert shapes("IndexedFold", {"rows": rows, "idx": idx[..., 0]}, 1, mode="dense", batch_size=2,
                  spatial_shape=[3, 4]) == [[2, 16, 3, 4]]
    nbr = np.zeros((5, 27), np.int64)
    assert shapes("IndexedConv", {"X": x, "idx": nbr, "W": np.zeros((27, 16, 8), np.float32)}, 1) == [[5, 8]]
    assert shapes("InverseMap", {"nbr": nbr, "like": x}, 1) == [[27, 7]]
    assert shapes("ScatterMatrices", {"nbr": nbr, "like": x}, 1) == [[27, 5, 7]]
    assert shapes("CapacityPads", {"x": rows}, 1, capacity=8) == [[6]]
    assert shapes("PairLists", {"nbr": nbr, "like": x}, 3, capacities=[3] * 27) == [[27 * 4], [27, 5], [28]]


# ----------------------------------------------------------------------------------------------------
# Refusals: each names the op and the problem, and nothing crashes

GRID = {"kernel_shape": [3, 3], "spatial_shape": [4, 4]}


def conv_inputs(**changed) -> dict:
    """Valid IndexedConv inputs (X [3, 2], idx [1, 2], W [2, 2, 4]) with some of them replaced."""
    valid = {"X": np.zeros((3, 2), np.float32), "idx": np.array([[0, 1]], np.int64), "W": np.zeros((2, 2, 4), np.float32)}
    return {**valid, **changed}

GOOD = np.array([[0, 1, 1], [0, 2, 3], [1, 0, 0]], np.int64)
ERRORS = {
    "out-of-grid coordinate": (
        "SubmanifoldMap", {"coords": np.array([[0, 1, 1], [0, 5, 3]], np.int64)}, 1, GRID,
        r"SubmanifoldMap: coordinate \(0, 5, 3\) of row 1 of coords is outside the grid \[4, 4\]"),
    "negative coordinate": (
        "StridedMap", {"coords": np.array([[0, -1, 3]], np.int64)}, 2, GRID,
        r"StridedMap: coordinate \(0, -1, 3\) of row 0 of coords is outside the grid"),
    "negative batch": (
        "TransposedMap", {"coords": np.array([[0, 1, 1], [-1, 0, 0]], np.int64)}, 2, GRID,
        r"TransposedMap: row 1 of coords has a negative batch -1"),
    "batch overflowing int64": (
        "SubmanifoldMap", {"coords": np.array([[2**62, 0, 0]], np.int64)}, 1, GRID,
        r"SubmanifoldMap: row 0 of coords has batch \d+, too large for linear sites to fit in int64"),
    "duplicated coordinate": (
        "SubmanifoldMap", {"coords": np.array([[0, 1, 1], [1, 1, 1], [0, 1, 1]], np.int64)}, 1, GRID,
        r"SubmanifoldMap: rows 0 and 2 of coords are the same coordinate \(0, 1, 1\)"),
    "duplicated coordinate, dense source": (
        "StridedMap", {"coords": np.array([[0, 1, 1], [0, 1, 1]], np.int64)}, 2, {**GRID, "source": "dense"},
        r"StridedMap: rows 0 and 1 of coords are the same coordinate"),
    "coords of the wrong width": (
        "SubmanifoldMap", {"coords": np.zeros((3, 4), np.int64)}, 1, GRID,
        r"SubmanifoldMap: coords must have shape \[N, 3\] \(batch and 2 spatial columns\), got \[3, 4\]"),
    "coords of the wrong rank": (
        "TargetMap", {"coords": np.zeros((3,), np.int64), "target_coords": GOOD}, 1, GRID,
        r"TargetMap: coords must have shape \[N, 3\].*got \[3\]"),
    "target coords outside the output grid": (
        "TargetMap", {"coords": GOOD, "target_coords": np.array([[0, 0, 0], [0, 6, 0]], np.int64)}, 1,
        {**GRID, "strides": [1, 1], "pads": [1, 1, 1, 1]},
        r"TargetMap: coordinate \(0, 6, 0\) of row 1 of target_coords is outside the output grid \[4, 4\]"),
    "target map neither transposed nor strided": (
        "TargetMap", {"coords": GOOD, "target_coords": GOOD}, 1, {**GRID, "transposed": 2},
        r"TargetMap: attribute 'transposed' = 2 must be 0 or 1"),
    "duplicated target coords": (
        "TargetMap", {"coords": GOOD, "target_coords": np.array([[0, 0, 0], [0, 0, 0]], np.int64)}, 1, GRID,
        r"TargetMap: rows 0 and 1 of target_coords are the same coordinate"),
    "site order of duplicated coords": (
        "SiteOrder", {"coords": np.array([[0, 1, 1], [0, 0, 0], [0, 1, 1]], np.int64)}, 3, {"spatial_shape": [4, 4]},
        r"SiteOrder: rows 0 and 2 of coords are the same coordinate \(0, 1, 1\)"),
    "site order outside the grid": (
        "SiteOrder", {"coords": np.array([[0, 1, 1], [0, 4, 0]], np.int64)}, 3, {"spatial_shape": [4, 4]},
        r"SiteOrder: coordinate \(0, 4, 0\) of row 1 of coords is outside the grid \[4, 4\]"),
    "batch at or above batch_size": (
        "SiteIndex", {"coords": GOOD}, 1, {"spatial_shape": [4, 4], "batch_size": 1},
        r"SiteIndex: row 2 of coords has batch 1, not below batch_size 1"),
    "rulebook index below -1": (
        "Rulebook", {"nbr": np.array([[0, -1], [-2, 1]], np.int64)}, 3, {},
        r"Rulebook: nbr\[1, 0\] = -2 is neither a row index nor -1"),
    "rulebook of the wrong rank": (
        "Rulebook", {"nbr": np.zeros((2, 3, 4), np.int64)}, 3, {},
        r"Rulebook: nbr must have shape \[M, K\], got \[2, 3, 4\]"),
    "rulebook skipping a tap it does not have": (
        "Rulebook", {"nbr": np.zeros((2, 3), np.int64)}, 3, {"skip_taps": [3]},
        r"Rulebook: attribute 'skip_taps' holds 3, but nbr has 3 taps"),
    "unfold row index out of range": (
        "IndexedUnfold", {"X": np.zeros((3, 2), np.float32), "idx": np.array([[0, 3]], np.int64)}, 1, {},
        r"IndexedUnfold: idx value 3 \(row 0, tap 1\) is outside \[0, 3\), the rows of X"),
    "unfold negative index other than -1": (
        "IndexedUnfold", {"X": np.zeros((3, 2), np.float32), "idx": np.array([[0, -5]], np.int64)}, 1, {},
        r"IndexedUnfold: idx value -5 .* only -1 marks a missing input"),
    "unfold dense site out of range": (
        "IndexedUnfold", {"X": np.zeros((1, 2, 4, 4), np.float32), "idx": np.array([[16]], np.int64)}, 1,
        {"spatial_shape": [4, 4]}, r"IndexedUnfold: idx value 16 .* outside \[0, 16\), the sites of X"),
    "features/coords row mismatch": (
        "IndexedUnfold", {"X": np.zeros((2, 2), np.float32), "idx": np.array([[0]], np.int64), "coords": GOOD}, 1,
        {}, r"IndexedUnfold: X has 2 rows but coords has 3: features and coords must pair row by row"),
    "dense unfold of the wrong grid": (
        "IndexedUnfold", {"X": np.zeros((1, 2, 4, 5), np.float32), "idx": np.array([[0]], np.int64)}, 1,
        {"spatial_shape": [4, 4]}, r"IndexedUnfold: X has shape \[1, 2, 4, 5\], its spatial dimensions differ"),
    "unfold of a scalar index": (
        "IndexedUnfold", {"X": np.zeros((3, 2), np.float32), "idx": np.array(0, np.int64)}, 1, {},
        r"IndexedUnfold: idx must have shape \[..., K\], got a scalar"),
    "fold index out of range": (
        "IndexedFold", {"rows": np.zeros((2, 3), np.float32), "idx": np.array([0, 4], np.int64),
                        "like": np.zeros((4, 1), np.float32)}, 1, {"mode": "rows"},
        r"IndexedFold: idx value 4 \(entry 1\) is outside \[0, 4\)"),
    "fold dense site out of range": (
        "IndexedFold", {"rows": np.zeros((1, 3), np.float32), "idx": np.array([32], np.int64)}, 1,
        {"mode": "dense", "batch_size": 2, "spatial_shape": [4, 4]}, r"IndexedFold: idx value 32 .* \[0, 32\)"),
    "fold rows of the wrong shape": (
        "IndexedFold", {"rows": np.zeros((3, 3), np.float32), "idx": np.array([0, 1], np.int64),
                        "like": np.zeros((4, 1), np.float32)}, 1, {"mode": "rows"},
        r"IndexedFold: rows must have shape idx.shape \+ \[C\] = \[2\] \+ \[C\], got \[3, 3\]"),
    "fold init of the wrong shape": (
        "IndexedFold", {"rows": np.zeros((2, 3), np.float32), "idx": np.array([0, 1], np.int64),
                        "like": np.zeros((4, 1), np.float32), "init": np.zeros((4, 2), np.float32)}, 1, {"mode": "rows"},
        r"IndexedFold: init must have the shape of Y \[4, 3\] or \[C\] = \[3\], got \[4, 2\]"),
    "fold like in mode dense": (
        "IndexedFold", {"rows": np.zeros((1, 3), np.float32), "idx": np.array([3], np.int64),
                        "like": np.zeros((3,), np.float32)}, 1,
        {"mode": "dense", "batch_size": 2, "spatial_shape": [4, 4]},
        r"IndexedFold: inputs 'like' and 'init' are for mode 'rows'"),
    "fold rows without like": (
        "IndexedFold", {"rows": np.zeros((2, 3), np.float32), "idx": np.array([0, 1], np.int64)}, 1,
        {"mode": "rows"}, r"IndexedFold: mode 'rows' needs input 'like'"),
    "pair lists index out of range": (
        "PairLists", {"nbr": np.array([[0, -1], [-1, 3]], np.int64), "like": np.zeros((3, 2), np.float32)}, 3, {},
        r"PairLists: nbr\[1, 1\] = 3 is neither -1 nor a row of like, in \[0, 3\)"),
    "pair lists over a tap's capacity": (
        "PairLists", {"nbr": np.array([[0, 1], [1, -1], [2, 0]], np.int64), "like": np.zeros((3,), np.int64)}, 3,
        {"capacities": [3, 1], "option": "max_pairs['conv1']"},
        r"PairLists: tap 1 has 2 pairs, more than the capacity 1 \(max_pairs\['conv1'\]\[1\]\); raise "
        r"max_pairs\['conv1'\]\[1\] to at least 2"),
    "pair lists of another tap count": (
        "PairLists", {"nbr": np.zeros((2, 3), np.int64), "like": np.zeros((3,), np.int64)}, 3, {"capacities": [2, 2]},
        r"PairLists: attribute 'capacities' has 2 entries for the 3 taps of nbr"),
    "inverse map index out of range": (
        "InverseMap", {"nbr": np.array([[0, -1], [-1, 3]], np.int64), "like": np.zeros((3, 2), np.float32)}, 1, {},
        r"InverseMap: nbr\[1, 1\] = 3 is neither -1 nor a row of like, in \[0, 3\)"),
    "inverse map index below -1": (
        "InverseMap", {"nbr": np.array([[0, -2]], np.int64), "like": np.zeros((3,), np.int64)}, 1, {},
        r"InverseMap: nbr\[0, 1\] = -2 is neither -1 nor a row of like"),
    "inverse map of an input read twice through a tap": (
        "InverseMap", {"nbr": np.array([[0, 1], [1, -1], [2, 1]], np.int64), "like": np.zeros((3,), np.int64)}, 1,
        {}, r"InverseMap: output rows 0 and 2 both read input row 1 through tap 1"),
    "inverse map of the wrong rank": (
        "InverseMap", {"nbr": np.zeros((2, 3, 4), np.int64), "like": np.zeros((3,), np.int64)}, 1, {},
        r"InverseMap: nbr must have shape \[M, K\], got \[2, 3, 4\]"),
    "inverse map like of rank 0": (
        "InverseMap", {"nbr": np.zeros((2, 3), np.int64), "like": np.array(3, np.int64)}, 1, {},
        r"InverseMap: like must have shape \[N, ...\], got a scalar"),
    "conv index out of range": (
        "IndexedConv", conv_inputs(idx=np.array([[0, 3]], np.int64)), 1, {},
        r"IndexedConv: idx value 3 \(row 0, tap 1\) is outside \[0, 3\), the rows of X; only -1 marks a missing input"),
    "conv index below -1": (
        "IndexedConv", conv_inputs(idx=np.array([[-5, 0]], np.int64)), 1, {},
        r"IndexedConv: idx value -5 \(row 0, tap 0\) is outside"),
    "conv weights of another shape": (
        "IndexedConv", conv_inputs(W=np.zeros((2, 3, 4), np.float32)), 1, {},
        r"IndexedConv: W must have shape \[K, Cin, Cout\] = \[2, 2, Cout\], got \[2, 3, 4\]"),
    "conv bias of another width": (
        "IndexedConv", conv_inputs(B=np.zeros(3, np.float32)), 1, {},
        r"IndexedConv: B must have shape \[Cout\] = \[4\], got \[3\]"),
    "residual of other rows": (
        "IndexedConv", conv_inputs(B=None, coords=None, R=np.zeros((3, 4), np.float32)), 1, {},
        r"IndexedConv: R must have shape \[M, Cout\] = \[1, 4\] \(a residual on the output rows\), got \[3, 4\]"),
    "unknown activation": (
        "IndexedConv", conv_inputs(), 1, {"activation": "gelu"},
        r"IndexedConv: attribute 'activation' is 'gelu', expected one of 'none', 'relu'"),
    "conv features unpaired with coords": (
        "IndexedConv", conv_inputs(X=np.zeros((2, 2), np.float32), B=np.zeros(4, np.float32), coords=GOOD), 1, {},
        r"IndexedConv: X has 2 rows but coords has 3: features and coords must pair row by row"),
    "conv of dense features": (
        "IndexedConv", conv_inputs(X=np.zeros((1, 2, 4, 4), np.float32), idx=np.array([[0]], np.int64),
                                   W=np.zeros((1, 2, 4), np.float32)), 1, {},
        r"IndexedConv: X must be rows \[N, Cin\], got shape \[1, 2, 4, 4\]"),
    "conv table of rank 3": (
        "IndexedConv", conv_inputs(idx=np.zeros((1, 1, 2), np.int64)), 1, {},
        r"IndexedConv: idx must be a table \[M, K\], got shape \[1, 1, 2\]"),
    "scatter matrices index out of range": (
        "ScatterMatrices", {"nbr": np.array([[0, 4]], np.int64), "like": np.zeros((4, 1), np.float32)}, 1, {},
        r"ScatterMatrices: nbr\[0, 1\] = 4 is neither -1 nor a row of like, in \[0, 4\)"),
    "scatter matrices above max_bytes": (
        "ScatterMatrices", {"nbr": np.full((2, 3), -1, np.int64), "like": np.zeros((5, 1), np.float32)}, 1,
        {"max_bytes": 119},
        r'ScatterMatrices: S \[K, M, N\] = \[3, 2, 5\] takes 120 bytes, more than max_bytes = 119; '
        r'use combine="gather" or "scatter"'),
    "scatter matrices above 2^63 bytes": (
        "ScatterMatrices", {"nbr": np.full((2, 3), -1, np.int64), "like": np.zeros((2**61, 0), np.uint8)}, 1, {},
        r"ScatterMatrices: S \[K, M, N\] = \[3, 2, 2305843009213693952\] takes more than 2\^63 bytes, more than "
        r"max_bytes = 1073741824"),
    "capacity exceeded": (
        "CapacityPads", {"x": np.zeros((5, 2), np.float32)}, 1, {"capacity": 3},
        r"CapacityPads: x has 5 rows, more than the capacity 3 \(max_active\); raise max_active to at least 5"),
    "capacity pads of a scalar": (
        "CapacityPads", {"x": np.array(1.0, np.float32)}, 1, {"capacity": 3},
        r"CapacityPads: x must have shape \[N, ...\], got a scalar"),
    "active sites of the wrong rank": (
        "ActiveSites", {"X": np.zeros((2, 3), np.float32)}, 2, {},
        r"ActiveSites: X must have shape \[B, C, \*S\] with 1 to 3 spatial dimensions, got \[2, 3\]"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_invalid_inputs_raise(case):
    op_type, inputs, n_outputs, attributes, message = ERRORS[case]
    for threads in (1, 8):
        with pytest.raises(Exception, match=message):
            run(op_type, inputs, n_outputs, threads, **attributes)


ATTRIBUTE_ERRORS = {
    "missing kernel_shape": ("SubmanifoldMap", {"spatial_shape": [4, 4]}, r"attribute 'kernel_shape' is required"),
    "even submanifold kernel": ("SubmanifoldMap", {**GRID, "kernel_shape": [2, 3]}, r"must be odd"),
    "kernel of the wrong length": ("StridedMap", {**GRID, "kernel_shape": [3]},
                                   r"'kernel_shape' has 1 values, expected 2"),
    "zero stride": ("StridedMap", {**GRID, "strides": [0, 1]}, r"attribute 'strides' = \[0, 1\] needs values in \[1"),
    "empty output grid": ("StridedMap", {"kernel_shape": [5, 5], "spatial_shape": [4, 4]},
                          r"the output grid \[0, 0\] has an extent below 1"),
    "unknown source": ("SubmanifoldMap", {**GRID, "source": "grid"}, r"attribute 'source' is 'grid', expected one of"),
    "negative max_bytes": ("ScatterMatrices", {"max_bytes": -1}, r"attribute 'max_bytes' = -1 must be at least 0"),
    "missing capacity": ("CapacityPads", {}, r"attribute 'capacity' is required"),
    "negative capacity": ("CapacityPads", {"capacity": -1}, r"attribute 'capacity' = -1 must be at least 0"),
    "negative pair capacity": ("PairLists", {"capacities": [1, -1]}, r"attribute 'capacities' holds -1; each must be "
                                                                      r"at least 0"),
    "no rulebook groups": ("Rulebook", {"groups": 0}, r"attribute 'groups' = 0 must lie in \[1, 64\]"),
    "rulebook outputs of another group count": (
        "Rulebook", {"groups": 2}, r"a rulebook of 2 groups has 6 outputs \(in_rows, out_rows, taps per group\), "
                                   r"the node has 3"),
    "negative skipped tap": ("Rulebook", {"skip_taps": [-1]}, r"attribute 'skip_taps' holds -1: taps are ≥ 0"),
}
ATTRIBUTE_INPUTS = {  # valid inputs of each op above, and its output count
    "SubmanifoldMap": ({"coords": GOOD}, 1),
    "StridedMap": ({"coords": GOOD}, 2),
    "ScatterMatrices": ({"nbr": np.array([[0, -1]], np.int64), "like": GOOD}, 1),
    "CapacityPads": ({"x": GOOD}, 1),
    "PairLists": ({"nbr": np.array([[0, -1]], np.int64), "like": GOOD}, 3),
    "Rulebook": ({"nbr": np.array([[0, -1]], np.int64)}, 3),
}


@pytest.mark.parametrize("case", sorted(ATTRIBUTE_ERRORS))
def test_invalid_attributes_raise(case):
    op_type, attributes, message = ATTRIBUTE_ERRORS[case]
    with pytest.raises(Exception, match=f"{op_type}: .*{message}"):
        run(op_type, *ATTRIBUTE_INPUTS[op_type], **attributes)


# ----------------------------------------------------------------------------------------------------
# Runtime glue


def test_library_path_override(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSE_LOWER_LIBRARY", get_library_path())
    assert get_library_path().endswith(".so")
    monkeypatch.setenv("SPARSE_LOWER_LIBRARY", str(tmp_path / "missing.so"))
    with pytest.raises(FileNotFoundError, match="SPARSE_LOWER_LIBRARY"):
        get_library_path()


def test_create_session_takes_bytes_and_paths(tmp_path):
    model = op_model("SiteIndex", {"coords": GOOD}, 1, spatial_shape=[4, 4], batch_size=2)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    for source in (model, model.SerializeToString(), path, str(path)):
        (sites,) = create_session(source).run(None, {"coords": GOOD})
        assert_same(sites, ref.site_index(GOOD, [4, 4], 2))


def test_one_session_options_serves_several_sessions():
    model = op_model("SiteIndex", {"coords": GOOD}, 1, spatial_shape=[4, 4], batch_size=2)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    for _ in range(3):
        (sites,) = create_session(model, sess_options=options).run(None, {"coords": GOOD})
        assert_same(sites, ref.site_index(GOOD, [4, 4], 2))
