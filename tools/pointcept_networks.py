"""Pointcept's Point Transformer V3 and Sonata's encoder through sparse_lower on the real nuScenes frames,
against Pointcept's own module in PyTorch (spconv on one thread).

The networks are read from a Pointcept checkout (`--pointcept`, or $SPARSE_LOWER_POINTCEPT; nothing of it is
copied here) and built as sparse_lower/checkouts/pointcept.py says: `PTv3` (the nuScenes configuration of
`PT-v3m1`) and `Sonata` (the backbone of Sonata's pretraining configuration, `PT-v3m2` as an encoder), and
their `-small` versions, which the tests run. Each frame is gridded as Pointcept's nuScenes pipeline grids it
(GridSample at 0.05 m from the points' metric x, y, z, each from its own minimum). Each network is exported
once, on the first frame, with the export's defaults, and run on every frame, on a part of the last (another
number of points) and on a batch of parts of the first and last, on each target, against the module: the
per-point features, the error relative to the largest value. Targets: gpu, portable, nna (a capacity per
level, measured on the runs), and a toolchain's name (`--targets openvino`): the nna model's partition,
its nna segments compiled by the toolchain, every run across its segments (the table of segments printed).

    python tools/pointcept_networks.py --pointcept ~/Pointcept [--networks PTv3 ...]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

import sparse_lower
from sparse_lower.checkouts.pointcept import NETWORKS, build, export, grid_sampled, point_input, run_module
from sparse_lower.capacity import level_rows, most_members
from sparse_lower.toolchains.runner import compile_partition
from sparse_lower.frames.sample import load_voxels
from openpcdet_backbones import checkout_main
from voxelnext_openpcdet import FRAMES

TOLERANCE = 1e-4


def frame_cases(data: Path, frames: list[str]) -> dict:
    """The runs: each frame, a part of the last (another number of points), a batch of parts of the first and
    last; every part as Pointcept's pipeline grids it (`grid_sampled`: 0.05 m from its own minimum)."""
    loaded = {frame: load_voxels(data / FRAMES[frame])[0] for frame in frames}
    first, last = loaded[frames[0]], loaded[frames[-1]]
    cases = {frame: [grid_sampled(loaded[frame])] for frame in frames}
    cases[f"{frames[-1]}[:{len(last) * 2 // 5}]"] = [grid_sampled(last[:len(last) * 2 // 5])]
    cases["batch of 2"] = [grid_sampled(first[:len(first) // 2]), grid_sampled(last[:len(last) // 4])]
    return cases


def sessions(model, targets: list[str], feeds: list[dict], folder: Path) -> dict:
    """A run function per target: gpu and portable as they are; nna with a capacity per level and the most
    rows a pooling merges, measured on `feeds`; a toolchain's name (openvino, tvm, ...): that nna model's
    partition, its nna segments compiled by the toolchain into `folder`, run across its segments."""
    runs, nna = {}, None
    for target in targets:
        if target in ("gpu", "portable"):
            session = sparse_lower.create_session(sparse_lower.lower(model, target=target))
            runs[target] = lambda f, s=session: s.run(None, f)[0]
            continue
        if nna is None:
            nna = sparse_lower.lower(model, target="nna", max_active=level_rows(model, feeds),
                                     max_members=most_members(model, feeds))
        if target == "nna":
            session = sparse_lower.create_session(nna)
            runs[target] = lambda f, s=session: s.run(None, f)[0]
            continue
        parts = sparse_lower.partition(nna)
        print(parts.summary(ops=4), flush=True)
        compiled = compile_partition(parts, target, folder / target)
        runs[target] = lambda f, c=compiled: next(iter(c.run(f).values()))
    return runs


def check(checkout: Path, name: str, data: Path, frames: list[str], targets: list[str]) -> float:
    """Export, lower and run network `name` on the frames; print and return the worst relative error."""
    module = build(checkout, name)
    cases = frame_cases(data, frames)
    model = export(module, next(iter(cases.values())))
    feeds = {case: {key: value.numpy() for key, value in point_input(parts, module.channels).items()}
             for case, parts in cases.items()}
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="pointcept_") as folder:
        runs = sessions(model, targets, list(feeds.values()), Path(folder))
        for case, parts in cases.items():
            expected = run_module(module, parts)
            for target, run in runs.items():
                error = float(np.abs(run(feeds[case]) - expected).max() / np.abs(expected).max())
                worst = max(worst, error)
                print(f"{name:12s} {case:22s} {len(feeds[case]['feat']):7,} points  {target:8s} error {error:.2e}",
                      flush=True)
    return worst


def main(argv=None) -> int:
    return checkout_main(argv, __doc__.split("\n\n")[0], "pointcept", "a Pointcept checkout", list(NETWORKS), check,
                         engine=("torch_scatter", "pip install --no-build-isolation torch-scatter==2.1.2 "
                                                      '(and "sparse-lower[pointcept]")'))


if __name__ == "__main__":
    sys.exit(main())
