"""TorchSparse's own UNet and ResNet backbones through sparse_lower on the real nuScenes frames, against
TorchSparse 1.4.0 on the CPU (`bash tools/bench/install_torchsparse.sh CHECKOUT_AT_v1.4.0`).

The networks are `torchsparse/backbones` of a TorchSparse checkout at v2.0.0 (`--torchsparse`, or
$SPARSE_LOWER_TORCHSPARSE; nothing of it is copied here): SparseResUNet42, the MinkUNet its
`examples/backbones.py` runs, and SparseResNet21D. They were added in 2.0 and call only what 1.4 has
(`spnn.Conv3d`, `spnn.BatchNorm`, `spnn.ReLU`, `torchsparse.cat`), so their files load as a namespace over
the installed 1.4.0, the version mmdetection3d installs. (TorchSparse 2.0's CPU build refuses a strided conv
whose stride is not its kernel size, which SparseResNet21D has; 2.1 builds its kernel maps on the GPU only.)

Coordinates are the frame's voxels as TorchSparse orders them, `(z, y, x, batch)` (TorchSparse calls the
columns x, y, z; it treats them alike), with their 5 features; weights by TorchSparse's own initialisation
under a fixed seed, batch-norm statistics drawn near a trained one's. Each network is exported with
`sparse_lower.export` on the first frame (`max_spatial_shape` nuScenes' grid), lowered for gpu, nna (a
capacity per level measured on the frames) and portable, and run on every frame against the module in
TorchSparse: every level it returns, rows by site, the error relative to the largest value. Frames of one
batch only: TorchSparse 1.4's CPU kernel hash gives every query the batch of the first row (fixed in 2.0),
so its kernel maps are wrong for a batch above 1.

    python tools/torchsparse_networks.py --torchsparse ~/torchsparse-2.0 [--networks SparseResUNet42 ...]
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import numpy as np
import torch

import sparse_lower
from sparse_lower.checkouts import trained_statistics
from sparse_lower.capacity import level_rows
from sparse_lower.frames.sample import load_voxels
from openpcdet_backbones import checkout_main, compare
from voxelnext_openpcdet import FRAMES

GRID = (41, 1440, 1440)
NETWORKS = ["SparseResUNet42", "SparseResNet21D"]


def load_backbones(checkout: Path) -> types.ModuleType:
    """`torchsparse.backbones` of the checkout, over the installed TorchSparse (see the module docstring)."""
    if "torchsparse.backbones" not in sys.modules:
        import torchsparse

        package = types.ModuleType("torchsparse.backbones")
        package.__path__ = [str(checkout / "torchsparse" / "backbones")]
        sys.modules["torchsparse.backbones"] = torchsparse.backbones = package
        for name in ("unet", "resnet"):
            module = importlib.import_module(f"torchsparse.backbones.{name}")
            package.__dict__.update({key: getattr(module, key) for key in module.__all__})
    return sys.modules["torchsparse.backbones"]


def build(checkout: Path, name: str, channels: int, seed: int = 0) -> torch.nn.Module:
    """Network `name` with seeded weights and batch-norm statistics near a trained one's."""
    torch.manual_seed(seed)
    net = getattr(load_backbones(checkout), name)(in_channels=channels)
    trained_statistics(net, seed)
    return net.eval()


def frame_input(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(features float32, coords int32 as TorchSparse orders them) of a frame."""
    features, coords, _ = load_voxels(path)
    return features.astype(np.float32), coords[:, [1, 2, 3, 0]].astype(np.int32)


def check(checkout: Path, name: str, data: Path, frames: list[str], targets: list[str]) -> float:
    """Export, lower and run network `name` on the frames; print and return the worst relative error."""
    import torchsparse

    from sparse_lower.exporter.torchsparse_calls import torchsparse_inference

    loaded = {frame: frame_input(data / FRAMES[frame]) for frame in frames}
    first = next(iter(loaded.values()))
    module = build(checkout, name, first[0].shape[1])
    model = sparse_lower.export(module, torchsparse.SparseTensor(*(torch.from_numpy(a) for a in first)),
                                max_spatial_shape=list(GRID))
    feeds = [{"features": f, "coords": c.astype(np.int64)} for f, c in loaded.values()]
    options = {"gpu": {}, "portable": {}, "nna": {"max_active": level_rows(model, feeds)}}
    lowered = {target: sparse_lower.create_session(sparse_lower.lower(model, target=target, **options[target]))
               for target in targets}
    worst = 0.0
    for frame, (features, coords) in loaded.items():
        with torchsparse_inference(module):
            expected = module(torchsparse.SparseTensor(torch.from_numpy(features), torch.from_numpy(coords)))
        for target, session in lowered.items():
            error = compare(session.run(None, {"features": features, "coords": coords.astype(np.int64)}),
                            list(expected) if isinstance(expected, (list, tuple)) else [expected])
            worst = max(worst, error)
            print(f"{name:16s} {frame:12s} {len(coords):7,} sites  {target:8s} error {error:.2e}", flush=True)
    return worst


def main(argv=None) -> int:
    return checkout_main(argv, __doc__.split("\n\n")[0], "torchsparse", "a TorchSparse checkout at v2.0.0",
                         NETWORKS, check, engine=("torchsparse", "bash tools/bench/install_torchsparse.sh "
                                                  "CHECKOUT_AT_v1.4.0"))


if __name__ == "__main__":
    sys.exit(main())
