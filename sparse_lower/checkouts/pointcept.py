"""Pointcept's point transformers as sparse_lower runs them (the bench's PTv3 row, `sparse-lower demo --model
ptv3`, tools/pointcept_networks.py): Point Transformer V3 (`PT-v3m1`, the backbone of Pointcept's
`configs/nuscenes/semseg-pt-v3m1-0-base.py`) and Sonata's encoder (`PT-v3m2`, the backbone of
`configs/sonata/pretrain-sonata-v1m1-0-base.py`), both with `enable_flash=False`, read from a Pointcept
checkout ($SPARSE_LOWER_POINTCEPT; Pointcept is not on PyPI and nothing of it is copied here).

Pointcept's package `__init__` files import every model it has and its training engine, so only the files
the networks need load (their `__init__`s do not run), with its training hooks' base class standing in.
They need addict (`pip install "sparse-lower[pointcept]"`) and torch-scatter (`pip install
--no-build-isolation torch-scatter==2.1.2`, built from its source); timm's `DropPath` stands in as the
identity it is at inference where timm cannot import (timm needs a torchvision built for this torch, which
PyPI has only for CUDA's). `-small` networks have the same layers, narrower and shallower.

Weights are Pointcept's own initialisation under a fixed seed, with batch-norm statistics drawn near a
trained one's; `shuffle_orders` draws the orders' permutations from torch's generator, seeded alike for
the export and the module. The input is a frame as Pointcept's nuScenes pipeline gives it (`grid_sampled`:
its GridSample at 0.05 m of the frame's voxel means): `coord` (x, y, z in metres), `grid_coord` (the cell
on that grid, from the frame's own minimum), `feat` and `offset`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
from pathlib import Path

import numpy as np
import torch

from ..errors import SparseLowerError
from ..exporter import export as export_model
from . import namespace, trained_statistics

CHECKOUT_VARIABLE = "SPARSE_LOWER_POINTCEPT"
INSTALL = ('pip install "sparse-lower[pointcept]" && pip install --no-build-isolation torch-scatter==2.1.2, '
           "and a Pointcept checkout in $SPARSE_LOWER_POINTCEPT")
GRID_SIZE = 0.05  # metres: GridSample's grid_size in configs/nuscenes/semseg-pt-v3m1-0-base.py
NUSCENES = dict(in_channels=4, order=("z", "z-trans", "hilbert", "hilbert-trans"), stride=(2, 2, 2, 2),
                enc_depths=(2, 2, 2, 6, 2), enc_channels=(32, 64, 128, 256, 512), enc_num_head=(2, 4, 8, 16, 32),
                enc_patch_size=(1024,) * 5, dec_depths=(2, 2, 2, 2), dec_channels=(64, 64, 128, 256),
                dec_num_head=(4, 4, 8, 16), dec_patch_size=(1024,) * 4, mlp_ratio=4, qkv_bias=True, qk_scale=None,
                attn_drop=0.0, proj_drop=0.0, drop_path=0.3, shuffle_orders=True, pre_norm=True,
                enable_rpe=False, enable_flash=False, upcast_attention=False, upcast_softmax=False, enc_mode=False)
SONATA = dict(in_channels=9, order=("z", "z-trans", "hilbert", "hilbert-trans"), stride=(2, 2, 2, 2),
              enc_depths=(3, 3, 3, 12, 3), enc_channels=(48, 96, 192, 384, 512), enc_num_head=(3, 6, 12, 24, 32),
              enc_patch_size=(1024,) * 5, mlp_ratio=4, qkv_bias=True, qk_scale=None, attn_drop=0.0, proj_drop=0.0,
              drop_path=0.3, shuffle_orders=True, pre_norm=True, enable_rpe=False, enable_flash=False,
              upcast_attention=False, upcast_softmax=False, traceable=True, enc_mode=True, mask_token=True)
SMALL = dict(enc_depths=(1,) * 5, enc_channels=(16, 16, 32, 32, 32), enc_num_head=(2,) * 5, enc_patch_size=(128,) * 5)
SMALL_DECODER = dict(dec_depths=(1,) * 4, dec_channels=(16, 16, 32, 32), dec_num_head=(2,) * 4, dec_patch_size=(128,) * 4)
# name -> (Pointcept's module file, the backbone's configuration)
FILES = {"m1": "point_transformer_v3m1_base", "m2": "point_transformer_v3m2_sonata"}
NETWORKS = {"PTv3": ("m1", NUSCENES), "PTv3-small": ("m1", dict(NUSCENES, **SMALL, **SMALL_DECODER)),
            "PTv3-small-rpe": ("m1", dict(NUSCENES, **SMALL, **SMALL_DECODER, enable_rpe=True)),
            "Sonata": ("m2", SONATA), "Sonata-small": ("m2", dict(SONATA, **SMALL))}
def _drop_path_stand_in() -> None:
    """timm.layers.DropPath as the identity it is at inference, where timm cannot import."""
    try:
        import timm.layers  # noqa: F401
    except ImportError:
        class DropPath(torch.nn.Module):
            def __init__(self, drop_prob: float = 0.0, scale_by_keep: bool = True):
                super().__init__()
                self.drop_prob = drop_prob

            def forward(self, x):
                if self.training:
                    raise RuntimeError("the stand-in of timm's DropPath runs at inference only")
                return x

        layers = namespace("timm.layers", Path(), DropPath=DropPath)
        namespace("timm", Path(), layers=layers)


def load_pointcept(checkout: Path, file: str = "m1") -> types.ModuleType:
    """Pointcept's PT-v3m1 (or m2) module file, loaded from `checkout` (see the module docstring)."""
    name = f"pointcept.models.point_transformer_v3.{FILES[file]}"
    if "pointcept" not in sys.modules:
        _drop_path_stand_in()
        root = checkout / "pointcept"
        for package in ("", ".utils", ".models", ".engines", ".models.point_transformer_v3"):
            namespace(f"pointcept{package}", root.joinpath(*package.split(".")[1:]))

        class HookBase:  # the training hooks' base of Pointcept's PointModel, unused at inference
            pass

        namespace("pointcept.engines.hooks", root / "engines" / "hooks", HookBase=HookBase)
        prompts = namespace("pointcept.models.point_prompt_training", root / "models" / "point_prompt_training")
        prompts.PDNorm = importlib.import_module(f"{prompts.__name__}.prompt_driven_normalization").PDNorm
    return importlib.import_module(name)


def build(checkout: Path, name: str, seed: int = 0) -> torch.nn.Module:
    """Network `name` returning its per-point features, seeded (see the module docstring)."""
    torch.manual_seed(seed)
    file, config = NETWORKS[name]
    net = load_pointcept(checkout, file).PointTransformerV3(**config)
    trained_statistics(net, seed)

    class Features(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net, self.channels = net, config["in_channels"]

        def forward(self, data: dict):
            return self.net(data).feat

    return Features().eval()


def grid_sampled(features: np.ndarray, grid_size: float = GRID_SIZE, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The points Pointcept's nuScenes pipeline gives its network, from points whose first three features are
    metric x, y, z (a frame's voxel means): its `GridSample` (pointcept/datasets/transform.py, mode "train"
    with `hash_type="fnv"`, as the configuration's train and val pipelines run it) at `grid_size`. Each
    point's cell is floor(xyz / grid_size) less the points' own smallest cell, so every frame has another
    extent (1420 × 2104 × 160 cells for the CenterPoint frame, x, y, z); the cells are ordered by their FNV-64 hash,
    and one point is drawn per cell as GridSample draws it (NumPy's global generator, seeded by `seed`).
    Returns the kept points' features and their coords (0, z, y, x) on that grid (`point_input` makes them
    `grid_coord`, x, y, z)."""
    cells = np.floor(features[:, :3].astype(np.float64) / grid_size).astype(np.int64)
    cells -= cells.min(0) if len(cells) else 0
    keys = np.full(len(cells), np.uint64(14695981039346656037))
    with np.errstate(over="ignore"):
        for column in cells.astype(np.uint64).T:
            keys = (keys * np.uint64(1099511628211)) ^ column
    order = np.argsort(keys)
    _, counts = np.unique(keys[order], return_counts=True)
    np.random.seed(seed)
    firsts = np.cumsum(np.insert(counts, 0, 0)[:-1])
    kept = order[firsts + np.random.randint(0, counts.max(initial=1), counts.size) % counts]
    coords = np.concatenate([np.zeros((len(kept), 1), np.int64), cells[kept][:, ::-1]], axis=1)
    return features[kept], coords


def point_input(parts: list, channels: int = 4) -> dict:
    """Pointcept's input dict of the (features, coords) parts, one batch element each: `feat` of 4 channels
    (x, y, z, intensity) or 9 (Sonata's x, y, z, color, normal: the intensity as a gray color, normals 0)."""
    features = np.concatenate([f for f, _ in parts]).astype(np.float32)
    coords = np.concatenate([c for _, c in parts])
    feat = features[:, :4] if channels == 4 else np.concatenate(
        [features[:, :3], np.repeat(features[:, 3:4], 3, axis=1), np.zeros((len(features), 3), np.float32)], axis=1)
    return {"coord": torch.from_numpy(features[:, :3]),
            "grid_coord": torch.from_numpy(np.ascontiguousarray(coords[:, [3, 2, 1]], dtype=np.int64)),
            "feat": torch.from_numpy(np.ascontiguousarray(feat)),
            "offset": torch.from_numpy(np.cumsum([len(c) for _, c in parts]).astype(np.int64))}


def run_module(module, parts: list, seed: int = 1) -> np.ndarray:
    """The module's output on the parts, its orders' permutations drawn under `seed` as the export's are."""
    from ..exporter.spconv_calls import spconv_inference

    torch.manual_seed(seed)
    with spconv_inference(module):
        return module(point_input(parts, module.channels)).numpy()


def export(module, parts: list, seed: int = 1):
    """The module exported on the parts with the export's defaults: the grid `Point.sparsify` computes from the
    frame is bounded by what the coordinates hold (2^16 per axis, Pointcept's deepest serialization), not by
    the example's, so that one export takes every frame."""
    torch.manual_seed(seed)
    return export_model(module, (point_input(parts, module.channels),))


def checkout() -> Path:
    """The Pointcept checkout $SPARSE_LOWER_POINTCEPT names, or a SparseLowerError saying how to get one."""
    folder = os.environ.get(CHECKOUT_VARIABLE)
    if not folder or not (Path(folder).expanduser() / "pointcept" / "models").is_dir():
        raise SparseLowerError(f"Pointcept's networks are read from its source: ${CHECKOUT_VARIABLE} "
                               f"({folder or 'unset'}) is no Pointcept checkout", fix=INSTALL)
    return Path(folder).expanduser()


@contextlib.contextmanager
def _spconv_on_one_thread(module, threads: int):
    """Inside: torch on `threads` threads but for spconv's layers, on one (spconv 2.3.8's CPU kernels return
    wrong sums on more)."""
    from spconv.pytorch.conv import SparseConvolution

    torch.set_num_threads(threads)
    layers = [m for m in module.modules() if isinstance(m, SparseConvolution)]
    hooks = [h for m in layers for h in (m.register_forward_pre_hook(lambda *_: torch.set_num_threads(1)),
                                         m.register_forward_hook(lambda *_: torch.set_num_threads(threads)))]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def module_runner(module, parts: list, threads: int):
    """A zero-argument run of the module in PyTorch on the parts (torch on `threads` threads, spconv's
    layers on one), returning its output row count."""
    from ..exporter.spconv_calls import spconv_inference

    data = point_input(parts, module.channels)

    def run():
        torch.manual_seed(1)
        with spconv_inference(module), _spconv_on_one_thread(module, threads):
            return int(module(dict(data)).shape[0])

    return run
