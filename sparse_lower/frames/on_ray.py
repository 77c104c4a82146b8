"""The frame job on Ray Data: an actor pool of `FrameWorker`s, one onnxruntime session each.

Ray is an optional extra (`pip install "sparse-lower[ray]"`). The frames and the output folder must be
reachable at the same paths from every node (one machine, or a shared file system): actors read the
frames and write the outputs themselves, so that no feature map travels through the driver.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

from ..errors import SparseLowerError
from .worker import FrameResult, FrameWorker


def ray_module():
    """Ray, with Ray Data; refused with the extra to install when absent (asked before any work)."""
    try:
        import ray
        import ray.data
    except ImportError as error:
        raise SparseLowerError(f"Ray is not installed ({error})",
                               fix='pip install "sparse-lower[ray]", or run without --ray') from error
    return ray


def connect(address: str | None) -> bool:
    """Join the Ray cluster at `address` ("auto": the one this machine belongs to), or start a local one
    when `address` is None and $RAY_ADDRESS is unset; a session already connected is used as it is.
    Returns whether this call connected (and so should disconnect)."""
    ray = ray_module()
    if ray.is_initialized():
        return False
    ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    return True


def disconnect() -> None:
    ray_module().shutdown()


def cluster_cpus() -> int:
    return int(ray_module().cluster_resources().get("CPU", 1))


def results_on_ray(model: bytes, jobs: list[tuple[Path, Path]], workers: int, threads: int,
                   compress: bool) -> Iterator[FrameResult]:
    """Run (frame, output) `jobs` on `workers` actors of `threads` CPUs each; results as they finish."""
    ray = ray_module()
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the caller draws one bar for the whole job
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # its notes on execution plans and progress bars
    rows = [{"frame": str(frame), "output": str(output)} for frame, output in jobs]
    dataset = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
        FrameWorker, batch_size=1, compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=threads,
        fn_constructor_kwargs={"model": model, "threads": threads, "compress": compress})
    for row in dataset.iter_rows():
        yield FrameResult(str(row["frame"]), error=str(row["error"]), latency_ms=float(row["latency_ms"]),
                          warning=str(row["warning"]))
