"""`run_frames`: a lowered model over many frames, on this machine or on Ray, with a summary.

Evaluating a backbone means running it over a dataset split (nuScenes validation: 6,019 frames), a loop
every user would otherwise write by hand. The model is lowered first when it still holds sparse source
ops or an exporter's ops; every frame's outputs are written to their own file; a frame that fails is
reported by name and the others go on.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
from tqdm import tqdm

from ..api import lower
from ..errors import SparseLowerError
from ..importers import SOURCE_FORMAT, detect_format, format_title, import_model
from ..model_io import load, output_folder, recorded_options
from ..onnx_conventions import CUSTOM_DOMAIN, SOURCE_DOMAIN
from .files import find_frames, output_paths
from .worker import FrameResult, FrameWorker


def runnable(model: onnx.ModelProto | str | os.PathLike, target: str = "gpu") -> tuple[onnx.ModelProto, str]:
    """`model` in a form onnxruntime runs with the library, and what was done to it: an exporter's file is
    imported, source ops are lowered for `target`, a lowered or plain ONNX model is taken as it is."""
    model = load(model)
    done = []
    found = detect_format(model)
    if found != SOURCE_FORMAT:
        model = import_model(model)
        done.append(f"imported from the {format_title(found)} format")
    if any(node.domain == SOURCE_DOMAIN for node in model.graph.node):
        model = lower(model, target=target)
        done.append(f"lowered for the {target} target")
    if done:
        return model, ", ".join(done)
    return model, "already lowered: run as it is" if is_lowered(model) else "no sparse layers: run as it is"


def is_lowered(model: onnx.ModelProto) -> bool:
    """Whether `model` is a lowered one (its options recorded, or the library's custom ops in it)."""
    return bool(recorded_options(model)) or any(node.domain == CUSTOM_DOMAIN for node in model.graph.node)


@dataclass
class RunSummary:
    """What a job did: one result per frame run (in the order they finished), the frames skipped because
    their outputs were there, and the wall time."""

    results: list[FrameResult] = field(default_factory=list)
    skipped: int = 0
    wall_s: float = 0.0
    first_s: float = 0.0  # until the first frame was done: session (and actor) start-up and one frame

    @property
    def steady_frames_per_s(self) -> float:
        """Frames/s after the first: the rate a long job runs at, start-up left out."""
        return (len(self.results) - 1) / (self.wall_s - self.first_s) if self.wall_s > self.first_s else 0.0

    @property
    def failures(self) -> list[FrameResult]:
        return [r for r in self.results if not r.ok]

    @property
    def warnings(self) -> list[FrameResult]:
        """The frames that ran with a warning (NaN or infinite inputs)."""
        return [r for r in self.results if r.ok and r.warning]

    @property
    def frames_per_s(self) -> float:
        return len(self.results) / self.wall_s if self.wall_s else 0.0

    def latency_ms(self, percentile: float) -> float:
        """A percentile of the frames' onnxruntime run times (NaN when none ran)."""
        latencies = [r.latency_ms for r in self.results if r.ok]
        return float(np.percentile(latencies, percentile)) if latencies else float("nan")

    def __str__(self) -> str:
        skipped = f", {self.skipped} skipped (outputs already written)" if self.skipped else ""
        failed = f"{len(self.failures)} failed" if self.failures else "none failed"
        if self.warnings:
            failed += f", {len(self.warnings)} with a warning"
        counts = (f"{len(self.results)} frame{'' if len(self.results) == 1 else 's'}, {failed}{skipped}" if self.results
                  else f"no frames run{skipped}")
        if len(self.failures) == len(self.results):
            return counts
        rate = f"{self.frames_per_s:.1f} frames/s"
        if len(self.results) > 1:
            rate += (f"; {self.steady_frames_per_s:.1f} frames/s after the first frame, which took "
                     f"{self.first_s:.1f} s with the start-up")
        return (f"{counts} in {self.wall_s:.1f} s: {rate}; onnxruntime's run of a frame: median "
                f"{self.latency_ms(50):.1f} ms, 95th percentile {self.latency_ms(95):.1f} ms")


def run_frames(model: onnx.ModelProto | str | os.PathLike, frames, out_dir: str | os.PathLike, *,
               target: str = "gpu", threads: int | None = None, compress: bool = False, ray: bool = False,
               ray_address: str | None = None, workers: int | None = None, skip_existing: bool = False,
               progress: bool = True) -> RunSummary:
    """Run `model` over `frames` (`.npz` files with `features` and `coords`, or folders of them) and write
    each frame's outputs to `out_dir/<frame name>.npz` (keys: the model's output names).

    The model is lowered for `target` first if it still needs it. Locally one session runs every frame on
    `threads` onnxruntime threads (default: one per core). With `ray`, Ray Data runs `workers` actors
    (default: the cluster's CPUs / threads) of `threads` threads each (default 1) on the cluster at
    `ray_address` (default: a local instance, or the session already connected); the outputs are the
    same bytes as a local run's with the same `threads`. `progress` draws a bar with frames/s on stderr.
    Failed frames are in the summary's `failures`, never raised; their outputs are not written.
    `skip_existing` leaves out the frames whose output file exists: an interrupted job resumes where it
    stopped (an output file is only ever there complete), and a rerun retries only the failed frames.
    """
    if workers is not None and not ray:
        raise SparseLowerError("workers applies to a run on Ray", fix="add ray=True (--ray), or leave workers out")
    if ray:
        from .on_ray import ray_module

        ray_module()  # absent: said now, not after the lowering
    _count("threads", threads, least=0)
    _count("workers", workers, least=1)
    files = find_frames(frames)
    out_dir = output_folder(out_dir, "the output folder")
    jobs = list(zip(files, output_paths(files, out_dir)))
    summary = RunSummary()
    if skip_existing:
        summary.skipped = sum(output.exists() for _, output in jobs)
        jobs = [(frame, output) for frame, output in jobs if not output.exists()]
    if not jobs:
        return summary
    model, _ = runnable(model, target)
    serialized = model.SerializeToString()
    start = time.perf_counter()
    with tqdm(total=len(jobs), unit="frame", disable=not progress, file=sys.stderr, dynamic_ncols=True) as bar:
        for result in _results(serialized, jobs, threads, compress, ray, ray_address, workers):
            summary.results.append(result)
            summary.first_s = summary.first_s or time.perf_counter() - start
            bar.update()
            if not result.ok:
                bar.set_postfix(failed=len(summary.failures))
    summary.wall_s = time.perf_counter() - start
    return summary


def _count(name: str, value, least: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
        raise SparseLowerError(f"{name}={value!r} is not an int >= {least}", fix=f"give an int >= {least}, or leave it out")


def _results(model: bytes, jobs, threads, compress, ray, ray_address, workers) -> Iterator[FrameResult]:
    if not ray:
        worker = FrameWorker(model, threads or 0, compress)
        yield from (worker.process(frame, output) for frame, output in jobs)
        return
    from . import on_ray

    connected = on_ray.connect(ray_address)
    try:
        threads = threads or 1
        workers = workers or max(1, on_ray.cluster_cpus() // threads)
        yield from on_ray.results_on_ray(model, jobs, workers, threads, compress)
    finally:
        if connected:
            on_ray.disconnect()
