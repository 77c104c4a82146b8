"""mmdetection3d's own spconv networks (SECOND's and CenterPoint's SparseEncoder, PartA2's SparseUNet,
SparseEncoderSASSD, Cylinder3D's Asymm3DSpconv, MinkUNetBackbone on spconv) and MinkUNetBackbone on
MinkowskiEngine and TorchSparse, read from a checkout by tools/mmdet3d_backbones.py, exported with
sparse_lower.export and lowered for gpu, nna and portable, on both real frames against the engine.
mmdetection3d's model files import mmcv's compiled ops, which do not install here: these run where
$SPARSE_LOWER_MMDET3D names a checkout at v1.4.0 and mmengine, mmcv-lite and mmdet are installed
(`pip install "sparse-lower[mmdet3d]"`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("spconv.pytorch", reason='needs torch and spconv: pip install ".[spconv]"')
pytest.importorskip("mmdet", reason='needs mmengine, mmcv-lite and mmdet: pip install ".[mmdet3d]"')
pytestmark = pytest.mark.skipif(not os.environ.get("SPARSE_LOWER_MMDET3D"),
                                reason="mmdetection3d's networks are read from its source: set SPARSE_LOWER_MMDET3D "
                                       "to a checkout of open-mmlab/mmdetection3d at v1.4.0")

from conftest import DATA  # noqa: E402
from helpers import load_tool  # noqa: E402

TOOL = load_tool("mmdet3d_backbones")


# MinkUNet's other backends need their engine, built from source
ENGINES = {"minkowski": ("MinkowskiEngine", "bash tools/bench/install_minkowski.sh"),
           "torchsparse": ("torchsparse", "bash tools/bench/install_torchsparse.sh CHECKOUT_AT_v1.4.0")}


@pytest.mark.parametrize("name", list(TOOL.NETWORKS))
def test_mmdet3ds_network_exports_and_matches_its_engine_on_every_target(name):
    engine = ENGINES.get(TOOL.BACKENDS.get(name))
    if engine is not None:
        pytest.importorskip(engine[0], reason=f"needs {engine[0]}: {engine[1]}")
    worst = TOOL.check(Path(os.environ["SPARSE_LOWER_MMDET3D"]), name, DATA, list(TOOL.FRAMES),
                       ["gpu", "nna", "portable"])
    assert worst <= TOOL.TOLERANCE


def test_spvcnns_point_voxel_functions_are_refused_by_name():
    """SPVCNN's point branch (TorchSparse's sphash, sphashquery, spcount, spvoxelize, spdevoxelize) runs in
    C++ out of the trace: the export refuses it at mmdetection3d's first call rather than fix its results."""
    pytest.importorskip("torchsparse", reason="needs torchsparse: " + ENGINES["torchsparse"][1])
    import importlib

    import numpy as np
    import torch
    from mmengine.config import Config

    import sparse_lower
    from sparse_lower.errors import SparseLowerError
    from sparse_lower.frames.sample import load_voxels

    checkout = Path(os.environ["SPARSE_LOWER_MMDET3D"])
    TOOL.load_mmdet3d(checkout)
    options = dict(Config.fromfile(str(checkout / "configs/_base_/models/spvcnn.py")).model["backbone"])
    options.pop("type")
    network = importlib.import_module("mmdet3d.models.backbones.spvcnn_backone").SPVCNNBackbone(**options)
    features, coords, _ = load_voxels(DATA / TOOL.FRAMES[list(TOOL.FRAMES)[1]])
    example = (torch.from_numpy(features[:, :4].astype(np.float32)),
               torch.from_numpy(np.ascontiguousarray(coords[:, [1, 2, 3, 0]]).astype(np.int32)))
    with pytest.raises(SparseLowerError, match=r"torchsparse.nn.functional.sphash \(called at .*spvcnn_backone.py:"):
        sparse_lower.export(network, example)
