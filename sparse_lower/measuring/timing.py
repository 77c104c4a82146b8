"""Medians of timed calls: one system alone, or several taking turns so that a shared machine's drift
falls on all of them alike; and the onnxruntime session options a timed run uses (one thread unless
told, onnxruntime's own log quiet)."""

from __future__ import annotations

import time

import numpy as np
import onnxruntime as ort

THREADS = 1  # intra-op threads of a timed session, unless told: spconv's CPU kernels must run on one


def session_options(threads: int = THREADS) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return options


def median_of(samples: list[float]) -> float:
    """The median of seconds, in ms."""
    return float(np.median(samples)) * 1e3


def timed(fn) -> float:
    """Seconds one call of `fn` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_ms(run, repeat: int) -> float:
    """Median ms of `repeat` calls of `run` after one warm-up call: one system timed alone (the tools'
    tables; alternating_medians when systems are compared)."""
    run()
    return median_of([timed(run) for _ in range(repeat)])


def alternating_runs(runs: dict, repeat: int) -> dict[str, float]:
    """Median ms of `repeat` calls of each of `runs` (title: a function of no arguments), taking turns,
    so that the drift of a shared machine's speed falls on all of them alike (the tools' side-by-side
    comparisons)."""
    samples: dict[str, list[float]] = {title: [] for title in runs}
    for _ in range(repeat):
        for title, run in runs.items():
            samples[title].append(timed(run))
    return {title: median_of(values) for title, values in samples.items()}


def alternating_medians(sessions: dict, feeds: dict, repeat: int) -> dict[str, float]:
    """`alternating_runs` of onnxruntime sessions (title: session) on `feeds`."""
    return alternating_runs({title: lambda s=session: s.run(None, feeds) for title, session in sessions.items()},
                            repeat)
