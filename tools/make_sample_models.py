"""Write the sample models of `models/` that this repository can make (the source-op ones, and AIMET's
with aimet-torch's own export classes). The NVIDIA and Autoware samples were written by those
exporters' own tools and are kept as they are (models/README.md says how).

    python tools/make_sample_models.py        # rewrites models/centerpoint_head.onnx, sparse_unet.onnx,
                                              # aimet_three_layer.aimet.onnx (needs the spconv extra and
                                              # `pip install --no-deps aimet-torch==2.42.0`)
"""

from __future__ import annotations

import argparse
import importlib.util
import warnings
from pathlib import Path

import numpy as np
import onnx

from sparse_lower.models import CanonicalEmitter, centerpoint_head_stack, sparse_unet

MODELS = Path(__file__).resolve().parents[1] / "models"
AIMET_GRID = (6, 8, 8)


def aimet_three_layer(path: Path) -> None:
    """Three CustomSparseConv3DLayer (3→16 k3 p1, 16→16 k3 s2 p1, 16→8 k1) and ScatterDense, traced
    through torch.onnx on every site of a 6×8×8 grid, as AIMET's tracing path requires."""
    import torch

    spec = importlib.util.find_spec("aimet_torch")
    if spec is None:
        raise SystemExit("aimet-torch is not installed: pip install --no-deps aimet-torch==2.42.0")
    loader = importlib.util.spec_from_file_location(
        "aimet_spconv_export", Path(spec.submodule_search_locations[0]) / "_base" / "nn" / "modules" / "_spconv.py")
    aimet = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(aimet)

    class Network(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wrap = aimet.SparseTensorWrapper()
            self.conv1 = aimet.CustomSparseConv3DLayer(3, 16, 3, padding=1)
            self.conv2 = aimet.CustomSparseConv3DLayer(16, 16, 3, stride=2, padding=1)
            self.conv3 = aimet.CustomSparseConv3DLayer(16, 8, 1)
            self.scatter = aimet.ScatterDense()

        def forward(self, indices, features):
            return self.scatter(self.conv3(self.conv2(self.conv1(*self.wrap(indices, features)))))

    torch.manual_seed(0)
    indices = np.stack(np.meshgrid(*(np.arange(n) for n in (1, *AIMET_GRID)), indexing="ij"), -1).reshape(-1, 4)
    features = np.random.default_rng(0).standard_normal((len(indices), 3)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Network(), (torch.from_numpy(indices.astype(np.int32)), torch.from_numpy(features)),
                          str(path), opset_version=16, dynamo=False, input_names=["indices", "features"])


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    onnx.save(centerpoint_head_stack(), MODELS / "centerpoint_head.onnx")
    onnx.save(sparse_unet(CanonicalEmitter(), np.random.default_rng(0), base=8, levels=2, classes=4),
              MODELS / "sparse_unet.onnx")
    aimet_three_layer(MODELS / "aimet_three_layer.aimet.onnx")
    for path in sorted(MODELS.glob("*.onnx")):
        print(f"{path.relative_to(MODELS.parent)}  {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
