"""Concurrency and determinism: the custom-op library inside onnxruntime gives the same bits whatever the
intra-op thread count, under Python threads sharing one session, with sessions created at the same time,
and in two sessions with different options.

spconv's CPU kernels give wrong sums with two threads and onnxruntime's ScatterND-add races on repeated
indices; these tests are why we can say ours do neither. Every comparison is bitwise: the kernels fold in
a fixed order and cut work into blocks fixed by the problem size, never by the thread count.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import sparse_lower
from helpers import session
from oracle import random_sparse
from sparse_lower.models import SparseModelBuilder

GRID = (12, 24, 24)
LOWERINGS = {
    "gpu-auto": {"target": "gpu"},
    "gpu-unfold": {"target": "gpu", "strategy": "unfold"},
    "nna-gather": {"target": "nna", "combine": "gather"},
    "nna-scatter": {"target": "nna", "combine": "scatter"},
    "hybrid": {"target": "hybrid"},
}


def network() -> onnx.ModelProto:
    """SubM → Relu → SubM (+ residual) → SparseConv s2 → SubM → inverse conv back onto the input coords."""
    builder = SparseModelBuilder(3, 4, np.random.default_rng(1))
    builder.conv("SubmanifoldConv", 8, (3, 3, 3), GRID).relu()
    first = builder.features
    builder.conv("SubmanifoldConv", 8, (3, 3, 3), GRID).add(first)
    builder.conv("SparseConv", 16, (3, 3, 3), GRID, strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1]).relu()
    builder.conv("SubmanifoldConv", 16, (3, 3, 3), (6, 12, 12))
    builder.conv("SparseDeconv", 8, (3, 3, 3), (6, 12, 12), target_coords="coords", strides=[2, 2, 2],
                 pads=[1, 1, 1, 1, 1, 1], output_padding=[1, 1, 1])
    return builder.build()


def inputs(seed: int, count: int = 1500) -> dict:
    features, coords = random_sparse(np.random.default_rng(seed), 2, 4, GRID, count=count)
    return {"features": features, "coords": coords}


def assert_same_bits(actual: list, expected: list) -> None:
    for have, want in zip(actual, expected, strict=True):
        assert have.dtype == want.dtype and have.shape == want.shape
        np.testing.assert_array_equal(have.view(np.uint8), want.view(np.uint8))


@pytest.fixture(scope="module")
def lowered():
    model = network()
    return {name: sparse_lower.lower(model, **options) for name, options in LOWERINGS.items()}


@pytest.mark.parametrize("lowering", list(LOWERINGS))
def test_intra_op_threads_1_2_8_give_the_same_bits(lowered, lowering):
    feeds = inputs(0)
    runs = [session(lowered[lowering], threads).run(None, feeds) for threads in (1, 2, 8)]
    for other in runs[1:]:
        assert_same_bits(other, runs[0])


@pytest.mark.parametrize("lowering", ["gpu-auto", "nna-scatter"])
def test_eight_threads_share_one_session_for_100_runs_each(lowered, lowering):
    """Each thread feeds its own inputs (four different frames, different row counts) and checks every
    result against the single-threaded one."""
    frames = [inputs(seed, count) for seed, count in enumerate((1500, 900, 2100, 1))]
    expected = [session(lowered[lowering]).run(None, feeds) for feeds in frames]
    shared = session(lowered[lowering], threads=2)
    failures: list[str] = []

    def work(worker: int) -> None:
        for run in range(100):
            frame = (worker + run) % len(frames)
            try:
                assert_same_bits(shared.run(None, frames[frame]), expected[frame])
            except Exception as error:  # noqa: BLE001 - reported after the threads join
                failures.append(f"thread {worker}, run {run}: {error}")
                return

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[:3]


def test_sessions_load_the_library_at_the_same_time(lowered):
    """Eight threads each register the library on their own options and create a session at once."""
    feeds = inputs(3)
    expected = session(lowered["gpu-auto"]).run(None, feeds)
    results: dict[int, list] = {}
    start = threading.Barrier(8)

    def work(worker: int) -> None:
        start.wait()
        results[worker] = session(lowered["gpu-auto"], threads=1 + worker % 3).run(None, feeds)

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == list(range(8))
    for result in results.values():
        assert_same_bits(result, expected)


def test_two_sessions_with_different_options_agree(lowered):
    """One session sequential on 1 thread with graph optimizations off, one parallel on 4 threads with
    all of them, used in turns. The custom ops give the same bits; onnxruntime's optimizer may fuse the
    standard ops around them (MatMul + Add into Gemm), which rounds differently, so the second pair is
    compared to float32 rounding."""
    plain = session(lowered["gpu-auto"], 1, execution_mode=ort.ExecutionMode.ORT_SEQUENTIAL,
                    graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    optimized = session(lowered["gpu-auto"], 4, execution_mode=ort.ExecutionMode.ORT_PARALLEL,
                        graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    for seed in range(3):
        feeds = inputs(seed)
        first, second = plain.run(None, feeds), optimized.run(None, feeds)
        np.testing.assert_array_equal(first[1], second[1])  # coords: exact
        np.testing.assert_allclose(first[0], second[0], rtol=1e-5, atol=1e-5)
        assert_same_bits(plain.run(None, feeds), first)
