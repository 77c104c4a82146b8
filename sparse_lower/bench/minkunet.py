"""A MinkUNet for the benchmark's MinkUNet row, written once for MinkowskiEngine and for TorchSparse, so
that both peers run the same network and ours is `sparse_lower.export` of it (the MinkowskiEngine one
where MinkowskiEngine is installed, else the TorchSparse one).

The layout of MinkowskiEngine's MinkUNet14 (its examples/minkunet.py), in this project's own code: a
5³ stem to 32 channels; four levels down, each a 2³ stride-2 conv and one residual block of two 3³ convs
(32, 64, 128, 256 channels); four levels up, each a 2³ stride-2 transposed conv (256, 128, 96, 96
channels), the concatenation with the level's skip and one residual block (a 1³ conv on the shortcut
where the channels change); a 1³ conv to 20 classes. Batch norms after every conv, in eval mode, weights
seeded: timing only. Both engines' strided convs of kernel = stride place their outputs at the distinct
floor(c / 2), as the export writes them (docs/source_ops.md#the-floor-rule), so all three compute the
same rows.

Each runner builds a fresh sparse tensor per run, so the kernel maps are built inside the run, as in
inference, on MinkowskiEngine's peer's 2 torch threads (the machine's cores; both engines' CPU kernels are
correct with any count).
"""

from __future__ import annotations

import numpy as np

from .minkowski import peer_inference

DOWN = (32, 64, 128, 256)
UP = (256, 128, 96, 96)
CLASSES = 20


def _minkowski_layers():
    import MinkowskiEngine as ME

    return {"conv": lambda cin, cout, k, s=1: ME.MinkowskiConvolution(cin, cout, k, stride=s, dimension=3),
            "up": lambda cin, cout: ME.MinkowskiConvolutionTranspose(cin, cout, 2, stride=2, dimension=3),
            "norm": ME.MinkowskiBatchNorm, "relu": ME.MinkowskiReLU, "cat": lambda a, b: ME.cat(a, b)}


def _torchsparse_layers():
    import torchsparse
    import torchsparse.nn as spnn

    return {"conv": lambda cin, cout, k, s=1: spnn.Conv3d(cin, cout, k, stride=s),
            "up": lambda cin, cout: spnn.Conv3d(cin, cout, 2, stride=2, transposed=True),
            "norm": spnn.BatchNorm, "relu": spnn.ReLU, "cat": lambda a, b: torchsparse.cat([a, b])}


def minkunet(layers: dict, channels: int, seed: int = 0):
    """The MinkUNet of the module docstring from one engine's `layers`, in eval mode."""
    import torch
    from torch import nn

    torch.manual_seed(seed)

    def conv(cin, cout, k, s=1, relu=True):
        parts = [layers["conv"](cin, cout, k, s), layers["norm"](cout)]
        return nn.Sequential(*parts, layers["relu"]()) if relu else nn.Sequential(*parts)

    class Block(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.body = nn.Sequential(conv(cin, cout, 3), conv(cout, cout, 3, relu=False))
            self.shortcut = conv(cin, cout, 1, relu=False) if cin != cout else None
            self.relu = layers["relu"]()

        def forward(self, x):
            return self.relu(self.body(x) + (x if self.shortcut is None else self.shortcut(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = conv(channels, DOWN[0], 5)
            widths = (DOWN[0], *DOWN)
            self.down = nn.ModuleList(nn.Sequential(conv(widths[i], widths[i], 2, 2), Block(widths[i], widths[i + 1]))
                                      for i in range(len(DOWN)))
            skips = (*DOWN[-2::-1], DOWN[0])
            ins = (DOWN[-1], *UP[:-1])
            self.up = nn.ModuleList(nn.Sequential(layers["up"](ins[i], UP[i]), layers["norm"](UP[i]), layers["relu"]())
                                    for i in range(len(UP)))
            self.fuse = nn.ModuleList(Block(UP[i] + skips[i], UP[i]) for i in range(len(UP)))
            self.head = layers["conv"](UP[-1], CLASSES, 1)

        def forward(self, x):
            skips = [self.stem(x)]
            for down in self.down:
                skips.append(down(skips[-1]))
            y = skips.pop()
            for up, fuse in zip(self.up, self.fuse):
                y = fuse(layers["cat"](up(y), skips.pop()))
            return self.head(y)

    return Net().eval()


def minkowski_network(channels: int):
    return minkunet(_minkowski_layers(), channels)


def torchsparse_network(channels: int):
    return minkunet(_torchsparse_layers(), channels)


def minkowski_input(features: np.ndarray, coords: np.ndarray):
    """A MinkowskiEngine SparseTensor of the frame, coordinates (batch, z, y, x)."""
    import MinkowskiEngine as ME
    import torch

    return ME.SparseTensor(torch.from_numpy(np.ascontiguousarray(features, np.float32)),
                           torch.from_numpy(np.ascontiguousarray(coords, np.int32)))


def torchsparse_input(features: np.ndarray, coords: np.ndarray):
    """A TorchSparse SparseTensor of the frame, coordinates (z, y, x, batch) as TorchSparse orders them."""
    import torch
    import torchsparse

    return torchsparse.SparseTensor(torch.from_numpy(np.ascontiguousarray(features, np.float32)),
                                    torch.from_numpy(np.ascontiguousarray(coords[:, [1, 2, 3, 0]], np.int32)))


def runner(engine: str, features: np.ndarray, coords: np.ndarray):
    """A zero-argument run of the MinkUNet in `engine` ("minkowski" or "torchsparse") on the frame,
    returning the output row count."""
    network = minkowski_network if engine == "minkowski" else torchsparse_network
    make = minkowski_input if engine == "minkowski" else torchsparse_input
    net = network(features.shape[1])

    def run():
        with peer_inference(net):
            return int(net(make(features, coords)).F.shape[0])

    return run


def source_model(features: np.ndarray, coords: np.ndarray, grid):
    """(the MinkUNet as source ops, its feeds): `sparse_lower.export` of the MinkowskiEngine network, else of
    the TorchSparse one (whose coords input is TorchSparse's (z, y, x, batch)), on the frame's grid; an
    ImportError where neither engine is installed."""
    from ..exporter import export

    try:
        network, example = minkowski_network(features.shape[1]), minkowski_input(features, coords)
    except ImportError:
        network, example = torchsparse_network(features.shape[1]), torchsparse_input(features, coords)
    model = export(network, example, max_spatial_shape=list(grid), check=False)
    return model, {"features": features.astype(np.float32), "coords": example.C.numpy().astype(np.int64)}
