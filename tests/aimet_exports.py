"""aimet-torch's own spconv export (its `_spconv.py` classes, installed from PyPI without their
dependencies) on seeded networks, the spconv network its layers wrap, and inputs for them: shared by
test_wild (the exports against that network) and test_tool_variants (the exports after other tools)."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import numpy as np
import pytest

from sparse_lower.exporter.spconv_calls import spconv_inference


AIMET_NETWORKS = {
    # name: (grid, batch, layers as (Cin, Cout, kernel, stride, padding, dilation))
    "three-layers-1x1-strided": ((5, 6, 7), 2, [(3, 8, 3, 1, 1, 1), (8, 6, 1, 1, 0, 1), (6, 5, 3, 2, 0, 1)]),
    "anisotropic-dilated": ((6, 5, 4), 1, [(4, 7, (3, 1, 3), (1, 2, 2), (1, 0, 1), (2, 1, 1)),
                                           (7, 3, (2, 2, 1), 1, 0, 1)]),
    "one-tap-strided": ((4, 6, 5), 1, [(2, 3, 1, 2, 0, 1)]),
    # two layers of 4 output channels: without bias, AIMET gives each the same zero bias, which torch.onnx
    # stores once and passes to the second through an Identity
    "equal-zero-biases": ((4, 4, 4), 1, [(3, 4, 3, 1, 1, 1), (4, 4, 3, 2, 1, 1)]),
}


@functools.lru_cache(maxsize=None)
def aimet_spconv_module():
    """aimet_torch's spconv export module, loaded by its path from the installed aimet-torch.

    Importing `aimet_torch` itself runs its package initialisation, which needs a dozen packages the
    exporter does not use (and a CUDA torchvision); the module needs only torch and spconv, so the
    test installs aimet-torch without its dependencies and loads this one file of it."""
    import importlib.util

    spec = importlib.util.find_spec("aimet_torch")
    if spec is None:
        pytest.skip("aimet-torch is not installed: pip install --no-deps aimet-torch==2.42.0 (.ci/run does)")
    pytest.importorskip("spconv.pytorch", reason="AIMET's layers wrap spconv (the `spconv` extra)")
    path = Path(spec.submodule_search_locations[0]) / "_base" / "nn" / "modules" / "_spconv.py"
    if not path.is_file():
        pytest.skip(f"this aimet-torch has no {path.name} (2.42 has it)")
    loader = importlib.util.spec_from_file_location("aimet_spconv_export", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


def aimet_network(name: str, bias: bool, casts: bool = False):
    """AIMET's own layers (SparseTensorWrapper → CustomSparseConv3DLayer… → ScatterDense), seeded; with
    `casts`, the forward casts its int64 indices and float64 features first, as many users' code does."""
    import torch

    aimet = aimet_spconv_module()
    _, _, layers = AIMET_NETWORKS[name]

    class Network(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wrap = aimet.SparseTensorWrapper()
            self.convs = torch.nn.ModuleList(
                aimet.CustomSparseConv3DLayer(cin, cout, kernel, stride=stride, padding=padding, dilation=dilation,
                                              bias=bias) for cin, cout, kernel, stride, padding, dilation in layers)
            self.scatter = aimet.ScatterDense()

        def forward(self, indices, features):
            x = self.wrap(indices.int(), features.float()) if casts else self.wrap(indices, features)
            for conv in self.convs:
                x = conv(*x) if isinstance(x, tuple) else conv(x)
            return self.scatter(x)

    torch.manual_seed(sum(map(ord, name)))
    network = Network()
    with torch.no_grad():
        for conv in network.convs:
            conv.sp_conv_3d.weight.normal_()
            if bias:
                conv.sp_conv_3d.bias.normal_()
    return network


def aimet_export(name: str, bias: bool, path: Path, casts: bool = False):
    """The network exported as AIMET's users export it: torch.onnx (TorchScript exporter, opset 16),
    traced on every site of the grid (AIMET's tracing path reshapes the features to the dense grid)."""
    import torch

    grid, batch, _ = AIMET_NETWORKS[name]
    network = aimet_network(name, bias, casts)
    indices = np.stack(np.meshgrid(*(np.arange(n) for n in (batch, *grid)), indexing="ij"), -1).reshape(-1, 4)
    features = np.random.default_rng(0).standard_normal((len(indices), network.convs[0].sp_conv_3d.in_channels))
    dtypes = (np.int64, np.float64) if casts else (np.int32, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: no shape inference for the custom ops
        torch.onnx.export(network, (torch.from_numpy(indices.astype(dtypes[0])),
                                    torch.from_numpy(features.astype(dtypes[1]))),
                          str(path), opset_version=16, dynamo=False, input_names=["indices", "features"])
    return network


def aimet_sparse_inputs(rng, name: str, count: int, cin: int):
    """`count` distinct sites of the traced grid and batch, the last site among them: AIMET's eager
    forward takes the grid from the largest index in each column, the file from the traced grid."""
    grid, batch, _ = AIMET_NETWORKS[name]
    volume = int(np.prod(grid))
    sites = rng.choice(batch * volume - 1, size=count - 1, replace=False).tolist() + [batch * volume - 1]
    indices = np.column_stack([np.divmod(sites, volume)[0], *np.unravel_index(np.mod(sites, volume), grid)])
    return indices.astype(np.int32), rng.standard_normal((count, cin)).astype(np.float32)


def wrapped_spconv(network, indices: np.ndarray, features: np.ndarray, name: str) -> np.ndarray:
    """The spconv network AIMET's layers wrap: their own SparseConv3d modules on the sparse rows, then
    `.dense()`."""
    import spconv.pytorch as spconv
    import torch

    grid, batch, _ = AIMET_NETWORKS[name]
    with spconv_inference(network):
        x = spconv.SparseConvTensor(torch.from_numpy(features), torch.from_numpy(indices), list(grid), batch)
        for conv in network.convs:
            x = conv.sp_conv_3d(x)
        return x.dense().numpy()


def aimet_eager(network, indices: np.ndarray, features: np.ndarray) -> np.ndarray:
    """AIMET's own eager forward (which densifies between layers: equal to the sparse network only
    where no bias lands on an inactive site, i.e. for layers built without bias)."""
    import torch

    with spconv_inference(network):
        return network(torch.from_numpy(indices), torch.from_numpy(features)).numpy()
