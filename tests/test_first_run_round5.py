"""The smaller findings of the fifth first-run trial (issue 71, item 8), each from the command line as a user
meets it: refusals that name the size, the batch or the empty frame instead of a misleading number, no
folder or file left behind by a refusal, no TorchScript dump before an export's refusal, and MACs priced at
each level's own capacity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import sparse_lower
from helpers import sparse_lower_cli
from sparse_lower.models import centerpoint_head_stack
from sparse_lower.verify import example_inputs

HEAD = Path(__file__).resolve().parents[1] / "models" / "centerpoint_head.onnx"
UNET = Path(__file__).resolve().parents[1] / "models" / "sparse_unet.onnx"


def test_inspect_refuses_frames_without_voxels_rather_than_suggest_a_capacity_of_1(tmp_path):
    np.savez(tmp_path / "empty.npz", features=np.zeros((0, 5), np.float32), coords=np.zeros((0, 4), np.int64))
    run = sparse_lower_cli("inspect", str(HEAD), "--frames", "empty.npz", cwd=tmp_path)
    assert run.returncode == 2 and "--frames: the frame has no voxels" in run.stderr, run.stdout + run.stderr
    assert "--max-active 1" not in run.stdout


def test_a_capacity_one_site_overflows_fails_the_verification_naming_the_node(tmp_path):
    run = sparse_lower_cli("convert", str(HEAD), "-o", "m.onnx", "--target", "nna", "--max-active", "1", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "verify: FAILED: one random site already overflows a capacity (node 'sparseconv4" in run.stdout


def test_a_frame_the_static_form_cannot_hold_is_refused_before_anything_is_written(tmp_path):
    feeds = example_inputs(onnx.load(HEAD), np.random.default_rng(0), active=200)
    feeds["coords"][:, 0] = 2
    np.savez(tmp_path / "b2.npz", **feeds)
    run = sparse_lower_cli("convert", str(HEAD), "-o", "p.onnx", "--target", "portable", "--max-active", "400,400",
                           "--max-batch", "1", "--inputs", "b2.npz", cwd=tmp_path)
    assert run.returncode == 2 and "'coords' has batch index 2, and the static form holds batches 0 to 0" in run.stderr
    assert "fix: lower with --max-batch 3" in run.stderr and not (tmp_path / "p.onnx").exists()


def test_a_capacity_past_int32_is_refused_naming_the_size(tmp_path):
    run = sparse_lower_cli("convert", str(HEAD), "-o", "m.onnx", "--target", "nna", "--max-active", "99999999999",
                           cwd=tmp_path)
    assert run.returncode == 2 and "a capacity over 2,147,483,647 rows" in run.stderr, run.stderr
    assert "memory" in run.stderr and not (tmp_path / "m.onnx").exists()


def test_the_mac_table_prices_each_level_at_its_own_capacity(tmp_path):
    lowered = sparse_lower.lower(str(UNET), target="nna", max_active=[2000, 800, 300])
    onnx.save(lowered, tmp_path / "unet.nna.onnx")
    run = sparse_lower_cli("inspect", "unet.nna.onnx", cwd=tmp_path)
    assert "MACs (millions) at each level's capacity (max_active 2000,800,300)" in run.stdout, run.stdout
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines() if line.split()[:1] in (["stem"],
                                                                                                     ["enc2"])}
    # gpu MACs = sites · taps · Cin · Cout: enc2 (level 2) at 300 sites, not the input level's 2,000
    layers = {layer.name: layer for layer in sparse_lower.layer_costs.layer_costs(lowered)}
    enc2 = layers["enc2"]
    assert float(rows["enc2"][2].replace(",", "")) == pytest.approx(300 * enc2.taps * enc2.cin * enc2.cout / 1e6,
                                                                    abs=0.06)
    assert enc2.level == 2 and layers["stem"].level == 0


def test_an_export_refusal_prints_no_torchscript_graph(capfd):
    spconv = pytest.importorskip("spconv.pytorch", reason='needs spconv: pip install ".[spconv]"')
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = spconv.SubMConv3d(3, 4, 3, indice_key="a")

        def forward(self, x):
            y = self.conv(x)
            return y.replace_feature(torch.lgamma(y.features))

    coords = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2], [0, 3, 1, 1]], dtype=torch.int32)
    with pytest.raises(sparse_lower.SparseLowerError, match="torch.onnx cannot export aten::lgamma, called as lgamma"):
        sparse_lower.export(Net(), spconv.SparseConvTensor(torch.randn(3, 3), coords, [6, 6, 6], 1))
    assert "Torch IR graph" not in capfd.readouterr().out


def test_run_says_what_threads_0_means(tmp_path):
    assert "or 0: one per core" in " ".join(sparse_lower_cli("run", "--help", cwd=tmp_path).stdout.split())
