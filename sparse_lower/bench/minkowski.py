"""MinkowskiEngine 0.5.4 as a peer (a CPU build; docs/performance.md says how to install it).

It runs with 2 torch threads, the machine's cores (its CPU kernels are correct with any count). Timing
only, with random weights: MinkowskiEngine places a strided conv's outputs at the input sites
rounded down to multiples of the stride (`floor(i/s)·s` on its tensor-stride lattice), not at every
site some tap reaches as spconv and the source ops (docs/source_ops.md) do, so its strided layers
make fewer rows and its backbone is a slightly smaller network than ours; the table reports its rows
where they differ.

* Single layers: each run builds a fresh SparseTensor, so the kernel maps are built inside the run
  (as in inference), except the inverse conv, which reuses its forward conv's map, as spconv's does.
* The CenterPoint backbone (SpMiddleResNetFHD) written with its modules, BatchNorm in eval mode, up
  to the last sparse layer (its `.dense()` is not timed).
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

THREADS = 2


@contextmanager
def peer_inference(module):
    """A peer's module in eval mode, without gradients, on THREADS torch threads (restored afterwards)."""
    import torch

    threads = torch.get_num_threads()
    module.eval()
    torch.set_num_threads(THREADS)
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_num_threads(threads)


def _tensor(features: np.ndarray, coords: np.ndarray, stride: int = 1):
    import MinkowskiEngine as ME
    import torch

    coordinates = torch.from_numpy(np.ascontiguousarray(coords, np.int32))
    if stride > 1:
        coordinates[:, 1:] *= stride
    return ME.SparseTensor(torch.from_numpy(np.ascontiguousarray(features, np.float32)), coordinates,
                           tensor_stride=stride)


def layer_runner(kind: str, cin: int, cout: int, features: np.ndarray, coords: np.ndarray, fine=None):
    """A zero-argument run function for one layer (`kind`: subm / strided / transposed / inverse)
    returning the output row count."""
    import MinkowskiEngine as ME
    import torch

    ndim = coords.shape[1] - 1
    if kind in ("subm", "strided"):
        module = ME.MinkowskiConvolution(cin, cout, 3, stride=1 if kind == "subm" else 2, bias=False, dimension=ndim)
        return lambda: _run(module, lambda: _tensor(features, coords))
    if kind == "transposed":  # 2^D s2 from the coarse lattice (tensor stride 2) to the fine one
        module = ME.MinkowskiConvolutionTranspose(cin, cout, 2, stride=2, bias=False, dimension=ndim)
        return lambda: _run(module, lambda: _tensor(features, coords, stride=2))
    # inverse: the transposed conv back onto the fine sites of its forward strided conv
    fine_coords, _ = fine
    forward = ME.MinkowskiConvolution(cout, cin, 3, stride=2, bias=False, dimension=ndim)
    module = ME.MinkowskiConvolutionTranspose(cin, cout, 3, stride=2, bias=False, dimension=ndim)
    with peer_inference(forward):
        down = forward(_tensor(np.zeros((len(fine_coords), cout), np.float32), fine_coords))
    coarse = ME.SparseTensor(torch.randn(len(down.F), cin), coordinate_map_key=down.coordinate_map_key,
                             coordinate_manager=down.coordinate_manager)
    return lambda: _run(module, lambda: coarse)


def _run(module, make_input) -> int:
    with peer_inference(module):
        return int(module(make_input()).F.shape[0])


def centerpoint_runner(features: np.ndarray, coords: np.ndarray, seed: int = 0):
    """SpMiddleResNetFHD with MinkowskiEngine modules; the run returns the last layer's row count."""
    import MinkowskiEngine as ME
    import torch

    torch.manual_seed(seed)

    def conv(cin, cout, kernel=3, stride=1):
        return [ME.MinkowskiConvolution(cin, cout, kernel, stride=stride, bias=False, dimension=3),
                ME.MinkowskiBatchNorm(cout), ME.MinkowskiReLU()]

    class Block(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.body = torch.nn.Sequential(*conv(c, c), *conv(c, c)[:2])
            self.relu = ME.MinkowskiReLU()

        def forward(self, x):
            return self.relu(self.body(x) + x)

    layers = [*conv(features.shape[1], 16), Block(16), Block(16)]
    for cin, cout in ((16, 32), (32, 64), (64, 128)):
        layers += [*conv(cin, cout, 3, 2), Block(cout), Block(cout)]
    layers += conv(128, 128, (3, 1, 1), (2, 1, 1))
    network = torch.nn.Sequential(*layers)
    return lambda: _run(network, lambda: _tensor(features, coords))
