"""VoxelNeXt as OpenPCDet writes it, through sparse_lower, on the real nuScenes frames.

OpenPCDet's own modules are read from a checkout (`--openpcdet`, or $SPARSE_LOWER_OPENPCDET; nothing of
it is copied here): `VoxelResBackBone8xVoxelNeXt` from pcdet/models/backbones_3d/spconv_backbone_voxelnext.py
with the helpers it imports (pcdet/utils/spconv_utils.py), and `SeparateHead` from
pcdet/models/dense_heads/voxelnext_head.py (that file's other imports need OpenPCDet's compiled CUDA ops,
so the class alone is taken from its source), configured as tools/cfgs/nuscenes_models/
cbgs_voxel0075_voxelnext.yaml says (read from the checkout). Weights and BatchNorm statistics are drawn
with a fixed seed, the modules run in eval mode with spconv 2.3.8 on the CPU (one thread).

For each frame: the detector (backbone, then the six heads on its output) is exported with
`sparse_lower.export`, lowered for gpu, nna (a capacity per level and max_members measured on the frames)
and hybrid, and every head branch's rows are compared with spconv's (same sites; error relative to the
branch's largest value). The median time of spconv and of each lowered model (onnxruntime, 1 and 2
threads) is printed side by side.

    python tools/voxelnext_openpcdet.py --openpcdet ~/OpenPCDet [--frames bevfusion] [--repeat 3]
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import yaml
from torch import nn

import sparse_lower
from sparse_lower.capacity import level_rows, most_members
from sparse_lower.frames.sample import load_voxels
from sparse_lower.exporter.spconv_calls import spconv_inference

FRAMES = {"centerpoint": "nuscenes_centerpoint_voxels.npz", "bevfusion": "nuscenes_bevfusion_voxels.npz"}
CONFIG = "tools/cfgs/nuscenes_models/cbgs_voxel0075_voxelnext.yaml"
TOLERANCE = 1e-4


def openpcdet_classes(checkout: Path):
    """(VoxelResBackBone8xVoxelNeXt, SeparateHead) from an OpenPCDet checkout."""
    package = Path(tempfile.mkdtemp(prefix="pcdet_"))
    for folder in ("pcdet", "pcdet/utils", "pcdet/models", "pcdet/models/backbones_3d"):
        (package / folder).mkdir(parents=True, exist_ok=True)
        (package / folder / "__init__.py").write_text("")
    for file in ("pcdet/utils/spconv_utils.py", "pcdet/models/backbones_3d/spconv_backbone_voxelnext.py"):
        (package / file).symlink_to(checkout / file)
    sys.path.insert(0, str(package))
    from pcdet.models.backbones_3d.spconv_backbone_voxelnext import VoxelResBackBone8xVoxelNeXt

    return VoxelResBackBone8xVoxelNeXt, class_from_source(checkout, "pcdet/models/dense_heads/voxelnext_head.py",
                                                          "SeparateHead")


def class_from_source(checkout: Path, file: str, name: str):
    """The class `name` of the pcdet file `file` from its source alone: the dense heads' files import
    OpenPCDet's compiled ops, which their classes do not use."""
    import spconv.pytorch as spconv
    from torch.nn.init import kaiming_normal_

    body = ast.parse((checkout / file).read_text()).body
    (node,) = [n for n in body if isinstance(n, ast.ClassDef) and n.name == name]
    namespace = {"nn": nn, "torch": torch, "spconv": spconv, "kaiming_normal_": kaiming_normal_, "np": np}
    exec(compile(ast.Module([node], []), f"{Path(file).name}:{name}", "exec"), namespace)
    return namespace[name]


class Detector(nn.Module):
    """OpenPCDet's VoxelNeXt up to its head convolutions: the backbone on a voxel batch, then each
    SeparateHead on the encoded sparse tensor (VoxelNeXtHead.forward's `head(x)` per class group)."""

    def __init__(self, backbone, heads):
        super().__init__()
        self.backbone = backbone
        self.heads = nn.ModuleList(heads)

    def forward(self, x):
        batch = self.backbone({"voxel_features": x.features, "voxel_coords": x.indices, "batch_size": x.batch_size})
        encoded = batch["encoded_spconv_tensor"]
        return encoded, [head(encoded) for head in self.heads]


def build(checkout: Path, seed: int = 0) -> Detector:
    backbone_class, head_class = openpcdet_classes(checkout)
    config = yaml.safe_load((checkout / CONFIG).read_text())["MODEL"]
    head_config = config["DENSE_HEAD"]
    torch.manual_seed(seed)
    backbone = backbone_class(config["BACKBONE_3D"], input_channels=5, grid_size=np.array([1440, 1440, 40]))
    heads = []
    for group in head_config["CLASS_NAMES_EACH_HEAD"]:
        branches = dict(head_config["SEPARATE_HEAD_CFG"]["HEAD_DICT"])
        branches["hm"] = {"out_channels": len(group), "num_conv": head_config["NUM_HM_CONV"]}
        heads.append(head_class(head_config.get("SHARED_CONV_CHANNEL", 128), branches,
                                head_config.get("KERNEL_SIZE_HEAD", 3), init_bias=-2.19,
                                use_bias=head_config.get("USE_BIAS_BEFORE_NORM", False)))
    detector = Detector(backbone, heads)
    trained_looking(detector, seed)
    return detector.eval()


def trained_looking(module: nn.Module, seed: int) -> None:
    """He-scaled conv weights (a first layer reading nuScenes' 5 voxel features divided by their spread) and
    BatchNorm statistics near a trained one's, so that outputs stay O(1) through the 30-odd layers; dense
    convs and batch norms (a dense tail) alike."""
    from spconv.pytorch.conv import SparseConvolution

    generator = torch.Generator().manual_seed(seed)
    first = True
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (SparseConvolution, nn.Conv2d, nn.ConvTranspose2d)):
                fan_in = (m.weight[0].numel() if isinstance(m, nn.Conv2d)
                          else m.in_channels * int(np.prod(m.kernel_size)))
                m.weight.normal_(0.0, float(np.sqrt(2.0 / fan_in)), generator=generator)
                if first and m.in_channels == 5:
                    m.weight /= torch.tensor([10.0, 10.0, 1.5, 20.0, 0.15])
                first = False
                if m.bias is not None:
                    m.bias.normal_(0.0, 0.05, generator=generator)
            elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.weight.uniform_(0.8, 1.2, generator=generator)
                m.bias.normal_(0.0, 0.1, generator=generator)
                m.running_mean.normal_(0.0, 0.1, generator=generator)
                m.running_var.uniform_(0.6, 1.6, generator=generator)


def _tensor(features, coords):
    import spconv.pytorch as spconv

    return spconv.SparseConvTensor(torch.from_numpy(features), torch.from_numpy(coords.astype(np.int32)),
                                   [41, 1440, 1440], 1)


def _spconv_branches(detector, features, coords):
    """Every head branch's rows in the sorted site order of the lowered model, and those sites."""
    with spconv_inference(detector):
        encoded, heads = detector(_tensor(features, coords))
    sites = encoded.indices.numpy().astype(np.int64)
    order = np.lexsort(sites.T[::-1])
    return [branch.numpy()[order] for head in heads for branch in head.values()], sites[order]


def _median(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--openpcdet", default=os.environ.get("SPARSE_LOWER_OPENPCDET"),
                        help="an OpenPCDet checkout (default: $SPARSE_LOWER_OPENPCDET)")
    parser.add_argument("--data", default="../shared/data", help="folder of the nuScenes voxel sets")
    parser.add_argument("--frames", nargs="+", default=list(FRAMES), choices=list(FRAMES))
    parser.add_argument("--targets", nargs="+", default=["gpu", "nna", "hybrid"])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per system (median)")
    args = parser.parse_args(argv)
    if not args.openpcdet:
        parser.error("give --openpcdet (an OpenPCDet checkout) or set SPARSE_LOWER_OPENPCDET")
    detector = build(Path(args.openpcdet).expanduser())
    frames = {}
    for name in args.frames:
        features, coords, _ = load_voxels(Path(args.data) / FRAMES[name])
        frames[name] = (features.astype(np.float32), coords.astype(np.int64))
    example = next(iter(frames.values()))
    model = sparse_lower.export(detector, _tensor(*example))
    print(f"exported: {len(model.graph.node)} nodes, "
          f"{sum(n.op_type == 'Coalesce' for n in model.graph.node)} Coalesce, outputs {len(model.graph.output)}")
    feeds = [{"features": f, "coords": c} for f, c in frames.values()]
    capacities, members = level_rows(model, feeds), most_members(model, feeds)
    print(f"capacity per level {capacities}, max_members {members}")
    options = {"gpu": {}, "nna": {"max_active": capacities, "max_members": members},
               "hybrid": {"max_active": capacities, "max_members": members}}
    worst = 0.0
    for name, (features, coords) in frames.items():
        expected, sites = _spconv_branches(detector, features, coords)
        spconv_time = _median(lambda: _spconv_branches(detector, features, coords), args.repeat)
        print(f"\n{name}: {len(coords):,} voxels, {len(sites):,} BEV sites; spconv 2.3.8 (1 thread) "
              f"{spconv_time * 1e3:.0f} ms")
        for target in args.targets:
            lowered = sparse_lower.lower(model, target=target, **options[target])
            print(f"  {target:7s}", end="")
            for threads in (1, 2):
                settings = ort.SessionOptions()
                settings.intra_op_num_threads = threads
                session = sparse_lower.create_session(lowered, sess_options=settings)
                feed = {"features": features, "coords": coords}
                outputs = session.run(None, feed)
                elapsed = _median(lambda: session.run(None, feed), args.repeat)
                print(f" {threads} thread{'s' if threads > 1 else ''} {elapsed * 1e3:6.0f} ms "
                      f"({spconv_time / elapsed:.2f}x spconv);", end="")
            same_sites = np.array_equal(outputs[1], sites)
            errors = [float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))
                      for got, want in zip(outputs[2:], expected)]
            worst = max(worst, max(errors)) if same_sites else float("inf")
            print(f" sites {'identical' if same_sites else 'DIFFER'}, {len(errors)} branches, worst error "
                  f"{max(errors):.2e}")
    print(f"\nworst relative error over every frame, target and branch: {worst:.2e} (limit {TOLERANCE:g})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
