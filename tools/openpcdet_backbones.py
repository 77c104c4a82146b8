"""Every spconv backbone of OpenPCDet's pcdet/models/backbones_3d, as OpenPCDet's own modules build it,
through sparse_lower on the real nuScenes frames against spconv 2.3.8 (one thread).

The modules are read from an OpenPCDet checkout (`--openpcdet`, or $SPARSE_LOWER_OPENPCDET; nothing of
it is copied here): each backbone file is linked into a package of its own with pcdet/utils/spconv_utils.py,
and pcdet/utils/common_utils.py (which imports SharedArray and OpenPCDet's distributed helpers) is replaced
by the one function the backbones call, `get_voxel_centers`. Each backbone takes OpenPCDet's batch dict
built from the frame (voxels: the frame's voxels, 5 features; pillars: the frame's (batch, y, x) sites,
32 features drawn with a fixed seed) on nuScenes' grid (1440 × 1440 × 40), with weights and batch-norm
statistics drawn with a fixed seed (voxelnext_openpcdet.trained_looking); what it returns in the batch
dict (the encoded sparse tensor, UNetV2's point features, the pillar backbones' dense `x_conv4` and the
output of their dense `conv5`) is exported with `sparse_lower.export`, lowered for gpu, nna (a capacity
per level measured on the frames) and portable, and compared with spconv's: sparse rows by site, dense
maps as they are, the error relative to each output's largest value.

And a whole CenterPoint detector as one file (`CenterPoint`, configured as tools/cfgs/nuscenes_models/
cbgs_voxel0075_res3d_centerpoint.yaml says): VoxelResBackBone8x, HeightCompression's `.dense()` and view,
BaseBEVBackbone's dense neck and CenterHead's shared conv and six SeparateHeads (CenterHead's own file
imports OpenPCDet's compiled NMS, so its shared conv is built here as its constructor builds it and
SeparateHead is taken from its source alone); every head branch of the file is compared with torch's.

`spconv_backbone_focal.py` (Focals Conv) is not among them: its FocalSparseConv keeps or drops each
output site by a learned importance score at run time (a site set that depends on the features, which
no source op expresses), and its file imports OpenPCDet's compiled CUDA op `points_in_boxes_gpu`.

    python tools/openpcdet_backbones.py --openpcdet ~/OpenPCDet [--backbones UNetV2 ...] [--frames bevfusion]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn

import sparse_lower
from sparse_lower.capacity import level_rows, most_members
from sparse_lower.frames.sample import load_voxels
from sparse_lower.exporter.spconv_calls import spconv_inference
from voxelnext_openpcdet import FRAMES, class_from_source, trained_looking

TOLERANCE = 1e-4
GRID = np.array([1440, 1440, 40])  # nuScenes' voxel grid (x, y, z), as OpenPCDet's configs give grid_size
# backbone -> (its file in pcdet/models/backbones_3d, its input ("voxels" or "pillars"), the batch dict's
# entries it computes that are compared)
BACKBONES = {
    "VoxelBackBone8x": ("spconv_backbone.py", "voxels", ["encoded_spconv_tensor"]),
    "VoxelResBackBone8x": ("spconv_backbone.py", "voxels", ["encoded_spconv_tensor"]),
    "UNetV2": ("spconv_unet.py", "voxels", ["encoded_spconv_tensor", "point_features"]),
    "VoxelResBackBone8xVoxelNeXt2D": ("spconv_backbone_voxelnext2d.py", "pillars", ["encoded_spconv_tensor"]),
    "PillarBackBone8x": ("spconv_backbone_2d.py", "pillars", ["x_conv4", "x_conv5"]),
    "PillarRes18BackBone8x": ("spconv_backbone_2d.py", "pillars", ["x_conv4", "x_conv5"]),
}
PILLAR_CHANNELS = 32
CENTERPOINT = "tools/cfgs/nuscenes_models/cbgs_voxel0075_res3d_centerpoint.yaml"
# the other pcdet files the CenterPoint detector takes its modules from
DETECTOR_FILES = ["pcdet/models/backbones_2d/base_bev_backbone.py",
                  "pcdet/models/backbones_2d/map_to_bev/height_compression.py"]
# pcdet/utils/common_utils.py's get_voxel_centers, for UNetV2's point coordinates (not compared here)
COMMON_UTILS = '''
import torch


def get_voxel_centers(voxel_coords, downsample_times, voxel_size, point_cloud_range):
    centers = voxel_coords[:, [2, 1, 0]].float()
    size = torch.tensor(voxel_size, dtype=torch.float32) * downsample_times
    return (centers + 0.5) * size + torch.tensor(point_cloud_range[0:3], dtype=torch.float32)
'''


def pcdet_class(checkout: Path, file: str, name: str):
    """The class `name` of the pcdet file `file` (a path in the checkout) from an OpenPCDet checkout."""
    package = Path(tempfile.mkdtemp(prefix="pcdet_"))
    files = [f"pcdet/models/backbones_3d/{backbone}" for backbone, _, _ in BACKBONES.values()] + DETECTOR_FILES
    for folder in {str(Path(f).parent) for f in files} | {"pcdet", "pcdet/utils", "pcdet/models"}:
        for part in [Path(folder), *Path(folder).parents][:-1]:
            (package / part).mkdir(parents=True, exist_ok=True)
            (package / part / "__init__.py").touch()
    (package / "pcdet/utils/spconv_utils.py").symlink_to(checkout / "pcdet/utils/spconv_utils.py")
    (package / "pcdet/utils/common_utils.py").write_text(COMMON_UTILS)
    for linked in set(files):
        (package / linked).symlink_to(checkout / linked)
    sys.path.insert(0, str(package))
    try:
        module = __import__(file[:-3].replace("/", "."), fromlist=[name])
    finally:
        sys.path.remove(str(package))
        for loaded in [key for key in sys.modules if key == "pcdet" or key.startswith("pcdet.")]:
            del sys.modules[loaded]  # each class's package is its own
    return getattr(module, name)


class Config(dict):
    """OpenPCDet's configuration dicts, read by attribute as its EasyDict is."""

    def __getattr__(self, key):
        value = self[key]
        return Config(value) if isinstance(value, dict) else value


class CenterPoint(nn.Module):
    """OpenPCDet's CenterPoint up to its head convolutions: the 3-D backbone, the BEV map, the 2-D neck,
    CenterHead's shared conv and each class group's SeparateHead (CenterHead.forward without its targets
    and decoding)."""

    def __init__(self, checkout: Path):
        super().__init__()
        config = Config(yaml.safe_load((checkout / CENTERPOINT).read_text())["MODEL"])
        backbone = pcdet_class(checkout, "pcdet/models/backbones_3d/spconv_backbone.py", config.BACKBONE_3D.NAME)
        self.backbone = backbone(config.BACKBONE_3D, input_channels=5, grid_size=GRID.copy())
        self.to_bev = pcdet_class(checkout, DETECTOR_FILES[1], config.MAP_TO_BEV.NAME)(config.MAP_TO_BEV)
        self.neck = pcdet_class(checkout, DETECTOR_FILES[0], config.BACKBONE_2D.NAME)(
            config.BACKBONE_2D, input_channels=config.MAP_TO_BEV.NUM_BEV_FEATURES)
        head = config.DENSE_HEAD
        self.shared_conv = nn.Sequential(  # as CenterHead.__init__ builds it
            nn.Conv2d(self.neck.num_bev_features, head.SHARED_CONV_CHANNEL, 3, stride=1, padding=1,
                      bias=head.get("USE_BIAS_BEFORE_NORM", False)),
            nn.BatchNorm2d(head.SHARED_CONV_CHANNEL, eps=head.get("BN_EPS", 1e-5), momentum=head.get("BN_MOM", 0.1)),
            nn.ReLU())
        separate_head = class_from_source(checkout, "pcdet/models/dense_heads/center_head.py", "SeparateHead")
        self.heads = nn.ModuleList()
        for group in head.CLASS_NAMES_EACH_HEAD:
            branches = {name: dict(branch) for name, branch in head.SEPARATE_HEAD_CFG.HEAD_DICT.items()}
            branches["hm"] = {"out_channels": len(group), "num_conv": head.NUM_HM_CONV}
            self.heads.append(separate_head(head.SHARED_CONV_CHANNEL, branches, init_bias=-2.19,
                                            use_bias=head.get("USE_BIAS_BEFORE_NORM", False)))

    def forward(self, x):
        batch = self.backbone({"voxel_features": x.features, "voxel_coords": x.indices, "batch_size": x.batch_size})
        features = self.shared_conv(self.neck(self.to_bev(batch))["spatial_features_2d"])
        return [head(features) for head in self.heads]


class FromTensor(nn.Module):
    """An OpenPCDet backbone on the batch dict made from an spconv tensor; returns the entries compared."""

    def __init__(self, backbone: nn.Module, inputs: str, entries: list[str]):
        super().__init__()
        self.backbone, self.inputs, self.entries = backbone, inputs, entries

    def forward(self, x):
        prefix = "voxel" if self.inputs == "voxels" else "pillar"
        batch = self.backbone({f"{prefix}_features": x.features, f"{prefix}_coords": x.indices,
                               "batch_size": x.batch_size})
        found = {**batch, **batch.get("multi_scale_2d_features", {})}
        return [found[entry] for entry in self.entries]


def build(checkout: Path, name: str, seed: int = 0) -> nn.Module:
    """Backbone `name` (or the CenterPoint detector) with weights drawn from `seed`, in eval mode."""
    torch.manual_seed(seed)
    if name == "CenterPoint":
        module = CenterPoint(checkout)
    else:
        file, inputs, entries = BACKBONES[name]
        channels = 5 if inputs == "voxels" else PILLAR_CHANNELS
        backbone = pcdet_class(checkout, f"pcdet/models/backbones_3d/{file}", name)(
            Config(RETURN_ENCODED_TENSOR=True), input_channels=channels, grid_size=GRID.copy(),
            voxel_size=[0.075, 0.075, 0.2], point_cloud_range=[-54.0, -54.0, -5.0, 54.0, 54.0, 3.0])
        module = FromTensor(backbone, inputs, entries)
    trained_looking(module, seed)
    return module.eval()


def frame_input(path: Path, inputs: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(features, coords int64, spatial shape) of a frame as the backbone reads it."""
    features, coords, _ = load_voxels(path)
    if inputs == "voxels":
        return features.astype(np.float32), coords.astype(np.int64), [int(g) for g in GRID[::-1] + [1, 0, 0]]
    sites = np.unique(coords[:, [0, 2, 3]], axis=0).astype(np.int64)  # (batch, y, x) of the frame's voxels
    features = np.random.default_rng(seed).standard_normal((len(sites), PILLAR_CHANNELS)).astype(np.float32)
    return features, sites, [int(g) for g in GRID[[1, 0]]]


def _tensor(features, coords, shape):
    import spconv.pytorch as spconv

    return spconv.SparseConvTensor(torch.from_numpy(features), torch.from_numpy(coords.astype(np.int32)), shape, 1)


def _comparable(item) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """(values, sites) of a returned item: a sparse tensor's rows with its sites (spconv's or
    MinkowskiEngine's), a dense map alone, a head's branches in order."""
    if isinstance(item, dict):
        return [pair for value in item.values() for pair in _comparable(value)]
    if isinstance(item, torch.Tensor):
        return [(item.numpy(), None)]
    if hasattr(item, "indices"):  # spconv's SparseConvTensor
        return [(item.features.numpy(), item.indices.numpy().astype(np.int64))]
    return [(item.F.numpy(), item.C.numpy().astype(np.int64))]  # MinkowskiEngine's SparseTensor


def _by_site(values: np.ndarray, sites: np.ndarray) -> np.ndarray:
    return values[np.lexsort(sites.T[::-1])]


def compare(outputs: list[np.ndarray], expected: list) -> float:
    """The largest error of `outputs` (the lowered model's, in graph order) against spconv's items, relative
    to each item's largest value; infinite where sites or shapes differ."""
    worst, position = 0.0, 0
    for item in expected:
        for want, sites in _comparable(item):
            got = outputs[position]
            if sites is not None:  # sparse: features then coords
                got_sites = outputs[position + 1]
                if got_sites.shape != sites.shape or not np.array_equal(np.unique(got_sites, axis=0),
                                                                        np.unique(sites, axis=0)):
                    return float("inf")
                got, want = _by_site(got, got_sites), _by_site(want, sites)
                position += 2
            else:
                position += 1
            if got.shape != want.shape:
                return float("inf")
            worst = max(worst, float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12)))
    return worst


def check(checkout: Path, name: str, data: Path, frames: list[str], targets: list[str]) -> float:
    """Export, lower and run backbone `name` on the frames; print and return the worst relative error."""
    module = build(checkout, name)
    inputs = "voxels" if name == "CenterPoint" else BACKBONES[name][1]
    loaded = {frame: frame_input(data / FRAMES[frame], inputs) for frame in frames}
    first = next(iter(loaded.values()))
    model = sparse_lower.export(module, _tensor(*first))
    feeds = [{"features": f, "coords": c} for f, c, _ in loaded.values()]
    options = {"gpu": {}, "portable": {}, "nna": {"max_active": level_rows(model, feeds)}}
    if any(node.op_type == "Coalesce" for node in model.graph.node):
        options["nna"]["max_members"] = most_members(model, feeds)
    worst = 0.0
    for frame, (features, coords, shape) in loaded.items():
        with spconv_inference(module):
            expected = module(_tensor(features, coords, shape))
        for target in targets:
            session = sparse_lower.create_session(sparse_lower.lower(model, target=target, **options[target]))
            error = compare(session.run(None, {"features": features, "coords": coords}), expected)
            worst = max(worst, error)
            print(f"{name:30s} {frame:12s} {len(coords):7,} sites  {target:8s} error {error:.2e}", flush=True)
    return worst


def checkout_main(argv, description: str, option: str, what: str, names: list[str], check,
                  engine: tuple[str, str] | None = None) -> int:
    """The command line of a tool that checks a framework's networks read from a checkout (this one,
    mmdet3d_backbones.py and the engines' tools): `--OPTION CHECKOUT` (or $SPARSE_LOWER_OPTION), `--networks`,
    `--frames`, `--targets`; `check(checkout, name, data, frames, targets)` returns a network's worst error.
    `engine` is (module, how to install it) where the networks need a sparse engine no extra installs: the
    tool imports it only to run, so `--help` works without it, and without it says how to get it."""
    env = f"SPARSE_LOWER_{option.upper()}"
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(f"--{option}", dest="checkout", default=os.environ.get(env),
                        help=f"{what} (default: ${env})")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="folder of the nuScenes voxel sets")
    parser.add_argument("--networks", "--backbones", nargs="+", default=names, choices=names)
    parser.add_argument("--frames", nargs="+", default=list(FRAMES), choices=list(FRAMES))
    parser.add_argument("--targets", nargs="+", default=["gpu", "nna", "portable"])
    args = parser.parse_args(argv)
    if not args.checkout:
        parser.error(f"give --{option} ({what}) or set {env}")
    if engine and importlib.util.find_spec(engine[0]) is None:
        parser.error(f"{engine[0]} is not installed in this Python: {engine[1]}")
    worst = max(check(Path(args.checkout).expanduser(), name, args.data, args.frames, args.targets)
                for name in args.networks)
    print(f"\nworst relative error over every network, frame and target: {worst:.2e} (limit {TOLERANCE:g})")
    return 0 if worst <= TOLERANCE else 1


def main(argv=None) -> int:
    return checkout_main(argv, __doc__.split("\n\n")[0], "openpcdet", "an OpenPCDet checkout",
                         [*BACKBONES, "CenterPoint"], check)


if __name__ == "__main__":
    sys.exit(main())
