"""The networks read from third-party checkouts, used alike by bench, demo, the tools and the tests
(Pointcept's point transformers: pointcept.py), and what they and the tools of mmdetection3d's,
OpenPCDet's, MinkowskiEngine's and TorchSparse's networks share (here): a checkout's packages made
importable without running the `__init__` files that import everything else, and weights that look
trained."""

from __future__ import annotations

import sys
import types
from pathlib import Path


def namespace(name: str, folder: Path, **names) -> types.ModuleType:
    """The package `name` as a namespace of `folder`: its files import, its __init__ does not run; `names`
    are set on it (stand-ins for what its __init__ would have made)."""
    module = types.ModuleType(name)
    module.__path__ = [str(folder)]
    module.__dict__.update(names)
    sys.modules[name] = module
    return module


def trained_statistics(module, seed: int) -> None:
    """Every batch norm's running statistics drawn near a trained one's (means in [-0.2, 0.2), variances in
    [0.5, 2)), under `seed`: with them, outputs stay O(1) through a deep network of seeded weights."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.rand(m.num_features, generator=generator) * 0.4 - 0.2)
                m.running_var.copy_(torch.rand(m.num_features, generator=generator) * 1.5 + 0.5)
