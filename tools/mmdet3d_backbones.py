"""mmdetection3d's own spconv networks, as its source builds them, through sparse_lower on the real nuScenes
frames against spconv 2.3.8 (one thread).

The modules are read from an mmdetection3d checkout at v1.4.0 (`--mmdet3d`, or $SPARSE_LOWER_MMDET3D;
nothing of it is copied here), with mmengine, mmcv-lite and mmdet from PyPI (`pip install
"sparse-lower[mmdet3d]"`). mmdetection3d's package `__init__` files import every model and mmcv's compiled
ops; so each package on the way to a network's file is made a namespace of the checkout's folder (its files
load as they are, its `__init__` does not run), with the names the files import from it. What stands in:

* `mmcv.ops`, mmcv's compiled ops: its sparse convs are spconv 2's (mmdetection3d's own `register_spconv2`
  puts them in place of mmcv's for every other network), with mmcv's semantics where Cylinder3D, the one
  network that imports mmcv's own, relies on them: `SparseConvTensor.features` is assignable, and a
  `SubMConv3d` whose `indice_key` an earlier conv of another kernel registered reuses that conv's kernel map
  with the first of its own weight taps, in order (mmcv's spconv 1.x port reuses a key's map unchecked and
  runs as many taps as the map has; spconv 2 refuses the reuse). Cylinder3D's asymmetric convs share a key
  within each block, so a block's convs all run on its first conv's kernel (its up blocks' 3 × 3 × 3 conv on
  the 1 × 3 × 3 map, with its first nine taps). mmcv's compiled ops do not install here, so this reading of
  mmcv is not checked against mmcv itself. The point ops SASSD's auxiliary training loss calls raise if
  called;
* `mmdet3d.structures` (box types, used in annotations only) and `mmdet.models.losses` (training only).

The networks, configured as mmdetection3d's configs say, on nuScenes' grid (41 × 1440 × 1440) where the
config names KITTI's, with weights and batch-norm statistics drawn with a fixed seed
(voxelnext_openpcdet.trained_looking):

| network | config | input |
|---|---|---|
| `SparseEncoder` as SECOND | configs/_base_/models/second_hv_secfpn_kitti.py | the frame's voxels, 4 features |
| `SparseEncoder` as CenterPoint | configs/_base_/models/centerpoint_voxel01_second_secfpn_nus.py | voxels, 5 features |
| `SparseUNet` (PartA2) | configs/_base_/models/parta2.py | the voxels, 4 features |
| `SparseEncoderSASSD` | configs/sassd/sassd_8xb6-80e_kitti-3d-3class.py (test mode) | the voxels, 4 features |
| `Asymm3DSpconv` (Cylinder3D) | configs/_base_/models/cylinder3d.py | cylindrical voxels, 16 seeded features |
| `MinkUNetBackbone`, spconv backend | configs/_base_/models/minkunet.py | the voxels, 4 features; grid from the frame |
| `MinkUNetBackbone-minkowski`: MinkowskiEngine backend | the same | the voxels, 4 features |
| `MinkUNetBackbone-torchsparse`: TorchSparse backend | the same | the voxels, batch last, 4 features |

Each is exported with `sparse_lower.export` on the first frame, lowered for gpu, nna (a capacity per
level measured on the frames) and portable, and run on every frame against mmdetection3d's module in
spconv: sparse rows by site, dense maps as they are, the error relative to each output's largest value.
MinkUNet computes its grid from the frame (`coors.max(0)[0][1:] + 1`) on spconv, and has none on
MinkowskiEngine and TorchSparse: it is exported with `max_spatial_shape=[41, 1440, 1440]`. Its other backends
run where MinkowskiEngine 0.5.4 and TorchSparse 1.4.0 (mmdetection3d's pin) are built
(tools/bench/install_minkowski.sh, tools/bench/install_torchsparse.sh).

    python tools/mmdet3d_backbones.py --mmdet3d ~/mmdetection3d [--networks MinkUNetBackbone ...]
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn

import sparse_lower
from sparse_lower.checkouts import namespace
from sparse_lower.capacity import level_rows
from sparse_lower.frames.sample import load_voxels
from sparse_lower.exporter.spconv_calls import spconv_inference
from openpcdet_backbones import checkout_main, compare
from voxelnext_openpcdet import FRAMES, trained_looking

TOLERANCE = 1e-4
GRID = [41, 1440, 1440]  # nuScenes' voxel grid (z, y, x) at 0.075 m
CYLINDER = {"grid": [480, 360, 32], "low": [0.0, -np.pi, -4.0], "high": [50.0, np.pi, 2.0], "channels": 16}
# network -> (its file under mmdet3d/models, its class, the config file, the key of its dict there, input)
NETWORKS = {
    "SECOND": ("middle_encoders/sparse_encoder.py", "SparseEncoder", "configs/_base_/models/second_hv_secfpn_kitti.py",
               "middle_encoder", "voxels"),
    "CenterPoint": ("middle_encoders/sparse_encoder.py", "SparseEncoder",
                    "configs/_base_/models/centerpoint_voxel01_second_secfpn_nus.py", "pts_middle_encoder", "voxels"),
    "SparseUNet": ("middle_encoders/sparse_unet.py", "SparseUNet", "configs/_base_/models/parta2.py", "middle_encoder",
                   "voxels"),
    "SparseEncoderSASSD": ("middle_encoders/sparse_encoder.py", "SparseEncoderSASSD",
                           "configs/sassd/sassd_8xb6-80e_kitti-3d-3class.py", "middle_encoder", "voxels"),
    "Asymm3DSpconv": ("backbones/cylinder3d.py", "Asymm3DSpconv", "configs/_base_/models/cylinder3d.py", "backbone",
                      "cylinder"),
    "MinkUNetBackbone": ("backbones/minkunet_backbone.py", "MinkUNetBackbone", "configs/_base_/models/minkunet.py",
                         "backbone", "voxels"),
    "MinkUNetBackbone-minkowski": ("backbones/minkunet_backbone.py", "MinkUNetBackbone",
                                   "configs/_base_/models/minkunet.py", "backbone", "voxels"),
    "MinkUNetBackbone-torchsparse": ("backbones/minkunet_backbone.py", "MinkUNetBackbone",
                                     "configs/_base_/models/minkunet.py", "backbone", "voxels, batch last"),
}
# MinkUNet's backend: spconv unless the name says (MinkowskiEngine and TorchSparse are built from source:
# tools/bench/install_minkowski.sh, tools/bench/install_torchsparse.sh)
BACKENDS = {"MinkUNetBackbone": "spconv", "MinkUNetBackbone-minkowski": "minkowski",
            "MinkUNetBackbone-torchsparse": "torchsparse"}


def _unavailable(name: str):
    def call(*args, **kwargs):
        raise RuntimeError(f"{name} is one of mmcv's compiled ops, which this environment does not have")

    return call


def _mmcv_submanifold(spconv):
    """spconv 2's SubMConv3d with mmcv's reuse of a key's kernel map (see the module docstring)."""

    class SubMConv3d(spconv.SubMConv3d):
        def forward(self, x, *args, **kwargs):
            found = x.find_indice_pair(self.indice_key) if self.indice_key is not None else None
            if found is None or list(found.ksize) == list(self.kernel_size):
                return super().forward(x, *args, **kwargs)
            taps = int(np.prod(found.ksize))
            if taps > int(np.prod(self.kernel_size)):
                raise ValueError(f"indice_key {self.indice_key!r}: the map of kernel {list(found.ksize)} has more "
                                 f"taps than this conv's kernel {list(self.kernel_size)}, which mmcv cannot run")
            kernel, weight = self.kernel_size, self.weight
            self.kernel_size = list(found.ksize)
            rows = weight.detach().reshape(weight.shape[0], -1, weight.shape[-1])[:, :taps]
            self.weight = nn.Parameter(rows.reshape(weight.shape[0], *found.ksize, weight.shape[-1]),
                                       requires_grad=False)
            try:
                return super().forward(x, *args, **kwargs)
            finally:
                self.kernel_size, self.weight = kernel, weight

    return SubMConv3d


def load_mmdet3d(checkout: Path) -> None:
    """mmdetection3d's model files importable from `checkout` (see the module docstring)."""
    import importlib

    import mmdet
    import spconv.pytorch as spconv

    spconv.SparseConvTensor.features = property(  # assignable, as mmcv's SparseConvTensor's
        lambda self: self._features, lambda self, value: setattr(self, "_features", value))
    ops = types.ModuleType("mmcv.ops")
    ops.__dict__.update({name: getattr(spconv, name) for name in ("SparseConv3d", "SparseConvTensor",
                                                                   "SparseInverseConv3d", "SparseModule",
                                                                   "SparseSequential")})
    ops.SubMConv3d = _mmcv_submanifold(spconv)
    ops.__dict__.update({name: _unavailable(name) for name in ("points_in_boxes_all", "three_interpolate", "three_nn")})
    sys.modules["mmcv.ops"] = ops
    installed = Path(mmdet.__file__).parent
    namespace("mmdet.models", installed / "models")
    namespace("mmdet.models.backbones", installed / "models/backbones")
    mmdet_layers = namespace("mmdet.models.layers", installed / "models/layers")
    mmdet_layers.ResLayer = importlib.import_module("mmdet.models.layers.res_layer").ResLayer
    losses = types.ModuleType("mmdet.models.losses")
    losses.__dict__.update(sigmoid_focal_loss=_unavailable("sigmoid_focal_loss"),
                           smooth_l1_loss=_unavailable("smooth_l1_loss"))
    sys.modules["mmdet.models.losses"] = losses
    root = checkout / "mmdet3d"
    namespace("mmdet3d", root)
    from mmengine.config import ConfigDict

    namespace("mmdet3d.utils", root / "utils", ConfigType=ConfigDict | dict, OptConfigType=ConfigDict | dict | None,
               OptMultiConfig=ConfigDict | dict | list | None, MultiConfig=ConfigDict | dict | list)
    structures = types.ModuleType("mmdet3d.structures")
    structures.BaseInstance3DBoxes = object
    sys.modules["mmdet3d.structures"] = structures
    namespace("mmdet3d.models", root / "models")
    layers = namespace("mmdet3d.models.layers", root / "models/layers")
    sparse_block = importlib.import_module("mmdet3d.models.layers.sparse_block")
    layers.__dict__.update(SparseBasicBlock=sparse_block.SparseBasicBlock,
                           make_sparse_convmodule=sparse_block.make_sparse_convmodule)
    namespace("mmdet3d.models.backbones", root / "models/backbones")
    namespace("mmdet3d.models.middle_encoders", root / "models/middle_encoders")


class Network(nn.Module):
    """An mmdetection3d network on (features, coords) and its other arguments, as its detector calls it."""

    def __init__(self, inner: nn.Module, name: str):
        super().__init__()
        self.inner, self.name = inner, name

    def forward(self, features, coords):
        if self.name in BACKENDS:
            return self.inner(features, coords)
        if self.name == "SparseEncoderSASSD":
            return self.inner(features, coords, 1, test_mode=True)[0]
        return self.inner(features, coords, 1)


def build(checkout: Path, name: str, seed: int = 0) -> nn.Module:
    """Network `name` as its config configures it (on nuScenes' grid), weights drawn from `seed`, eval mode."""
    import importlib

    from mmengine.config import Config

    load_mmdet3d(checkout)
    file, cls, config, key, _ = NETWORKS[name]
    options = dict(Config.fromfile(str(checkout / config)).model[key])
    options.pop("type")
    if "sparse_shape" in options:
        options["sparse_shape"] = list(GRID)
    if name in BACKENDS:
        options["sparseconv_backend"] = BACKENDS[name]
    torch.manual_seed(seed)
    module = getattr(importlib.import_module(f"mmdet3d.models.{file[:-3].replace('/', '.')}"), cls)(**options)
    network = Network(module, name)
    trained_looking(network, seed)
    return network.eval()


def frame_input(path: Path, name: str, channels: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(features float32, coords int32) of a frame as network `name` reads it."""
    features, coords, _ = load_voxels(path)
    if NETWORKS[name][4] == "voxels":
        return features[:, :channels].astype(np.float32), coords.astype(np.int32)
    if NETWORKS[name][4] == "voxels, batch last":  # TorchSparse's (x, y, z, batch), as mmdetection3d gives it
        return features[:, :channels].astype(np.float32), coords[:, [1, 2, 3, 0]].astype(np.int32)
    x, y, z = (features[:, i].astype(np.float64) for i in range(3))  # each voxel's point, one batch
    polar = np.stack([np.hypot(x, y), np.arctan2(y, x), z], axis=1)
    low, high, grid = (np.array(CYLINDER[k]) for k in ("low", "high", "grid"))
    cells = np.floor((polar - low) / (high - low) * grid).astype(np.int64)
    cells = cells[np.all((cells >= 0) & (cells < grid), axis=1)]
    sites = np.unique(np.column_stack([np.zeros(len(cells), np.int64), cells]), axis=0).astype(np.int32)
    return np.random.default_rng(seed).standard_normal((len(sites), CYLINDER["channels"])).astype(np.float32), sites


def _channels(name: str, module: nn.Module) -> int:
    return CYLINDER["channels"] if NETWORKS[name][4] == "cylinder" else int(next(
        m for m in module.modules() if hasattr(m, "in_channels")).in_channels)


def _export_options(name: str) -> dict:
    return {"max_spatial_shape": list(GRID)} if name in BACKENDS else {}


def check(checkout: Path, name: str, data: Path, frames: list[str], targets: list[str]) -> float:
    """Export, lower and run network `name` on the frames; print and return the worst relative error."""
    module = build(checkout, name)
    channels = _channels(name, module)
    loaded = {frame: frame_input(data / FRAMES[frame], name, channels) for frame in frames}
    first = tuple(torch.from_numpy(a) for a in next(iter(loaded.values())))
    model = sparse_lower.export(module, first, **_export_options(name))
    feeds = [{"features": f, "coords": c.astype(np.int64)} for f, c in loaded.values()]
    options = {"gpu": {}, "portable": {}, "nna": {"max_active": level_rows(model, feeds)}}
    worst = 0.0
    for frame, (features, coords) in loaded.items():
        with spconv_inference(module):
            expected = module(torch.from_numpy(features), torch.from_numpy(coords))
        expected = expected if isinstance(expected, (list, tuple)) else [expected]
        for target in targets:
            session = sparse_lower.create_session(sparse_lower.lower(model, target=target, **options[target]))
            error = compare(session.run(None, {"features": features, "coords": coords.astype(np.int64)}), expected)
            worst = max(worst, error)
            print(f"{name:20s} {frame:12s} {len(coords):7,} sites  {target:8s} error {error:.2e}", flush=True)
    return worst


def main(argv=None) -> int:
    return checkout_main(argv, __doc__.split("\n\n")[0], "mmdet3d", "an mmdetection3d checkout at v1.4.0",
                         list(NETWORKS), check)


if __name__ == "__main__":
    sys.exit(main())
