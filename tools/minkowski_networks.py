"""MinkowskiEngine's own MinkUNets and ResNets, as its examples build them, through sparse_lower on the real
nuScenes frames against MinkowskiEngine 0.5.4 on the CPU (`bash tools/bench/install_minkowski.sh`).

The networks are read from a MinkowskiEngine checkout at v0.5.4 (`--minkowski`, or $SPARSE_LOWER_MINKOWSKI;
nothing of it is copied here): `examples/minkunet.py`'s MinkUNet14, 18 and 34 (and their A–D widths), and
the classification ResNets of `examples/resnet.py` (instance norms, max pooling, a stride-3 conv, global
max pooling and a linear head), which minkunet.py imports. That file imports open3d (for its own demo only) and downloads a point cloud
when no `1.ply` lies in the working folder; so open3d is an empty module here and the examples load from a
temporary folder holding an empty `1.ply`.

Each network has 20 classes (per voxel for a MinkUNet, per frame for a ResNet), on the frame's voxels (their 5 features; coordinates
(batch, z, y, x) at tensor stride 1, on nuScenes' grid 41 × 1440 × 1440), with weights drawn by
MinkowskiEngine's own initialisation under a fixed seed and batch-norm statistics drawn near a trained
one's. It is exported with `sparse_lower.export` on the first frame (`max_spatial_shape` the grid),
lowered for gpu, nna (a capacity per level and a global pooling's rows, measured on the frames) and portable, and run on every frame
against the module in MinkowskiEngine: rows by site, the error relative to the largest value.

    python tools/minkowski_networks.py --minkowski ~/MinkowskiEngine [--networks MinkUNet14 ...]
"""

from __future__ import annotations

import os
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

import sparse_lower
from sparse_lower.checkouts import trained_statistics
from sparse_lower.capacity import level_rows, most_members
from sparse_lower.frames.sample import load_voxels
from openpcdet_backbones import checkout_main, compare
from voxelnext_openpcdet import FRAMES

GRID = (41, 1440, 1440)
CLASSES = 20
NETWORKS = ["MinkUNet14", "MinkUNet18", "MinkUNet34", "MinkUNet14A", "MinkUNet34C", "ResNet14", "ResNet18", "ResNet50"]


def load_examples(checkout: Path) -> types.ModuleType:
    """examples/minkunet.py of the checkout (see the module docstring for what stands in)."""
    if "examples.minkunet" not in sys.modules:
        sys.modules.setdefault("open3d", types.ModuleType("open3d"))
        folder = tempfile.mkdtemp(prefix="minkowski_")
        Path(folder, "1.ply").touch()
        here = os.getcwd()
        sys.path.insert(0, str(checkout))
        try:
            os.chdir(folder)
            import examples.minkunet  # noqa: F401
        finally:
            os.chdir(here)
            sys.path.remove(str(checkout))
    return sys.modules["examples.minkunet"]


def build(checkout: Path, name: str, channels: int, seed: int = 0) -> torch.nn.Module:
    """Network `name` with seeded weights and batch-norm statistics near a trained one's."""
    torch.manual_seed(seed)
    examples = load_examples(checkout)
    cls = getattr(examples, name, None) or getattr(sys.modules["examples.resnet"], name)
    net = cls(channels, CLASSES, D=3)
    trained_statistics(net, seed)  # MinkowskiBatchNorm's own torch BatchNorm1d
    return net.eval()


def check(checkout: Path, name: str, data: Path, frames: list[str], targets: list[str]) -> float:
    """Export, lower and run network `name` on the frames; print and return the worst relative error."""
    import MinkowskiEngine as ME

    from sparse_lower.exporter.minkowski_calls import minkowski_inference

    loaded = {}
    for frame in frames:
        features, coords, _ = load_voxels(data / FRAMES[frame])
        loaded[frame] = (features.astype(np.float32), coords.astype(np.int32))
    module = build(checkout, name, next(iter(loaded.values()))[0].shape[1])
    first = next(iter(loaded.values()))
    model = sparse_lower.export(module, ME.SparseTensor(torch.from_numpy(first[0]), torch.from_numpy(first[1])),
                                max_spatial_shape=list(GRID))
    feeds = [{"features": f, "coords": c.astype(np.int64)} for f, c in loaded.values()]
    options = {"gpu": {}, "portable": {},  # a global pooling's Coalesce needs the most rows of one batch (nna)
               "nna": {"max_active": level_rows(model, feeds), "max_members": most_members(model, feeds)}}
    lowered = {target: sparse_lower.create_session(sparse_lower.lower(model, target=target, **options[target]))
               for target in targets}
    worst = 0.0
    for frame, (features, coords) in loaded.items():
        with minkowski_inference(module):
            expected = module(ME.SparseTensor(torch.from_numpy(features), torch.from_numpy(coords)))
        for target, session in lowered.items():
            error = compare(session.run(None, {"features": features, "coords": coords.astype(np.int64)}), [expected])
            worst = max(worst, error)
            print(f"{name:12s} {frame:12s} {len(coords):7,} sites  {target:8s} error {error:.2e}", flush=True)
    return worst


def main(argv=None) -> int:
    return checkout_main(argv, __doc__.split("\n\n")[0], "minkowski", "a MinkowskiEngine checkout at v0.5.4",
                         NETWORKS, check, engine=("MinkowskiEngine", "bash tools/bench/install_minkowski.sh"))


if __name__ == "__main__":
    sys.exit(main())
