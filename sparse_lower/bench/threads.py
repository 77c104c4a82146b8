"""`sparse-lower bench --suite threads`: the CenterPoint backbone's time against the thread count, ours
beside spconv's, in one run.

Ours is the gpu target's model (SpMiddleResNetFHD, 5 features, deterministic weights) in onnxruntime
with that many intra-op threads; spconv 2.3.8 is the same network with that many torch threads; the
fp32 GEMM peak (onnxruntime's MatMul 2048³, best of 3) on as many threads is beside them. Both real
frames, medians after a warm-up. spconv's CPU kernels return wrong sums with more than one thread, so
each spconv entry also records its output's distance from ours (relative to the largest value): its
time on many threads is the time of a wrong answer.
"""

from __future__ import annotations

import os

import numpy as np

from ..api import lower
from ..frames.sample import CENTERPOINT_FILE, CENTERPOINT_GRID, real_feeds
from ..models import CanonicalEmitter, sp_middle_resnet_fhd
from ..runtime import create_session
from ..verify import relative_error
from .cases import BEVFUSION_FILE
from .systems import gemm_peak_gflops, session_options
from ..measuring.timing import median_ms

FRAMES = {"centerpoint": CENTERPOINT_FILE, "bevfusion": BEVFUSION_FILE}


def thread_counts(cores: int | None = None) -> list[int]:
    """Powers of two up to the machine's cores."""
    cores = cores or os.cpu_count() or 1
    return [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= cores]


def spconv_runner(features: np.ndarray, coords: np.ndarray, grid: tuple):
    """run(threads) -> the dense output of spconv's network of the same weights, on `threads` torch threads."""
    import torch

    from ..exporter.spconv_calls import spconv_inference
    from ..models.spconv_emitter import SpconvEmitter

    network = sp_middle_resnet_fhd(SpconvEmitter(), np.random.default_rng(0), spatial_shape=grid)

    def run(threads: int) -> np.ndarray:
        with spconv_inference(network.module):  # eval mode, no gradients; it pins 1 thread, undone here
            torch.set_num_threads(threads)
            (output,) = network.module(network.sparse_tensor(features, coords))
        return output.numpy()
    return run


def measure(repeat: int, counts: list[int] | None = None, log=print) -> dict:
    """{"threads": [...], "gemm_peak_gflops": {n: …}, "frames": {frame: {"voxels", "threads": {n: {"ours_ms",
    "spconv_ms", "spconv_distance"}}}}}; spconv's entries are absent where it is not installed."""
    counts = counts or thread_counts()
    result = {"threads": counts, "gemm_peak_gflops": {str(n): gemm_peak_gflops(2048, 3, threads=n) for n in counts},
              "frames": {}}
    for frame, file in FRAMES.items():
        feeds = real_feeds(file)
        grid = CENTERPOINT_GRID
        model = lower(sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0), spatial_shape=grid),
                      target="gpu")
        try:
            spconv = spconv_runner(feeds["features"], feeds["coords"], grid)
        except ImportError as missing:
            spconv = None
            result["spconv_skipped"] = f"spconv is not installed ({missing.name}): pip install 'sparse-lower[spconv]'"
        rows = result["frames"][frame] = {"voxels": len(feeds["coords"]), "threads": {}}
        want = None
        for n in counts:
            session = create_session(model, sess_options=session_options(n))
            entry = rows["threads"][str(n)] = {"ours_ms": median_ms(lambda: session.run(None, feeds), repeat)}
            if want is None:
                (want,) = session.run(None, feeds)
            if spconv is not None:
                entry["spconv_ms"] = median_ms(lambda: spconv(n), repeat)
                entry["spconv_distance"] = relative_error(spconv(n), want)
            log(f"{frame} frame, {n} thread{'s' if n > 1 else ''}: ours {entry['ours_ms']:.0f} ms"
                + (f", spconv {entry['spconv_ms']:.0f} ms" if spconv is not None else ""))
    return result
