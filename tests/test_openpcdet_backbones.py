"""OpenPCDet's own spconv backbones (pcdet/models/backbones_3d, read from a checkout:
tools/openpcdet_backbones.py) exported with sparse_lower.export, lowered for gpu, nna and portable, on the
real BEVFusion frame against spconv: UNetV2's channel reduction, the pillar backbones' dense conv5 in the
same file, the voxel backbones, and a whole CenterPoint detector (backbone, BEV neck, heads) as one file. OpenPCDet is not on PyPI: these run where $SPARSE_LOWER_OPENPCDET
names a checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("spconv.pytorch", reason='needs torch and spconv: pip install ".[spconv]"')
pytestmark = pytest.mark.skipif(not os.environ.get("SPARSE_LOWER_OPENPCDET"),
                                reason="OpenPCDet is not on PyPI: set SPARSE_LOWER_OPENPCDET to a checkout of "
                                       "open-mmlab/OpenPCDet to run its own backbones")

from conftest import DATA  # noqa: E402
from helpers import load_tool  # noqa: E402

TOOL = load_tool("openpcdet_backbones")


@pytest.mark.parametrize("name", [*TOOL.BACKBONES, "CenterPoint"])
def test_openpcdets_backbone_exports_and_matches_spconv_on_every_target(name):
    worst = TOOL.check(Path(os.environ["SPARSE_LOWER_OPENPCDET"]), name, DATA, ["bevfusion"],
                       ["gpu", "nna", "portable"])
    assert worst <= TOOL.TOLERANCE
