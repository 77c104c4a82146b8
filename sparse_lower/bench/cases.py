"""The benchmark cases: single sparse layers on real, random and 2D data, and whole networks.

A `Case` is built lazily (`case.build()`), so that only one case's tensors are alive at a time. Its
`Built` holds the source model with its feeds (what our systems lower), and what the other
systems need: an spconv factory (single layers: plain spconv modules; networks: `SpconvEmitter`),
a MinkowskiEngine one (`bench.minkowski`) and a dense-equivalent onnxruntime `Conv` /
`ConvTranspose` layer (single layers only).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..models import CanonicalEmitter, SparseModelBuilder, sp_middle_resnet_fhd, sparse_unet, voxelnext
from ..errors import SparseLowerError
from ..frames.sample import find_data, load_voxels
from ..onnx_conventions import IR_VERSION, OPSET
from . import minkowski, minkunet

CENTERPOINT_FILE = "nuscenes_centerpoint_voxels.npz"
BEVFUSION_FILE = "nuscenes_bevfusion_voxels.npz"
RANDOM_GRID = (41, 400, 352)
RANDOM_CAP = 120_000  # voxels: above it the random grid shrinks in y, x at the same density (unfold memory)
QUICK_CAP = 3_000


@dataclass
class LayerSpec:
    """One sparse conv: `kind` subm / strided / transposed / inverse."""

    label: str
    kind: str
    cin: int
    cout: int


LAYERS = (LayerSpec("SubM 3^3 16->16", "subm", 16, 16), LayerSpec("SubM 3^3 64->64", "subm", 64, 64),
          LayerSpec("SparseConv 3^3 s2 16->32", "strided", 16, 32),
          LayerSpec("SparseDeconv 2^3 s2 32->16", "transposed", 32, 16),
          LayerSpec("Inverse 3^3 s2 32->16", "inverse", 32, 16))


@dataclass
class Built:
    """What the systems run. `spconv`, `minkowski` and `torchsparse` are callables returning a zero-argument
    run function (or raising ImportError / a `Skip`; None: no such version); `dense` likewise returns
    `(onnx model, feeds)` or raises `Skip`."""

    source: onnx.ModelProto
    feeds: dict
    spconv: Callable
    minkowski: Callable
    dense: Callable | None
    rows_in: int
    grid: tuple
    note: str = ""
    torchsparse: Callable | None = None  # the MinkUNet row's TorchSparse run
    pointcept: Callable | None = None  # a Pointcept row's module in PyTorch: (threads) -> run
    ours: tuple | None = None  # the names of our systems that run the case (None: every one)


class Skip(Exception):
    """A system does not run this case; the message says why."""


@dataclass
class Case:
    name: str
    group: str  # layer-real / layer-random / layer-2d / network
    build: Callable[[], Built] = field(repr=False)
    description: str = ""


# --- data ------------------------------------------------------------------------------------------

def random_voxels(grid, density: float, rng: np.random.Generator, cap: int | None):
    """Unique uniform voxels at `density` of `grid`; above `cap` voxels the last two extents shrink by
    the same factor so that the density (hence the neighbour counts) stays. Returns (coords, grid, note)."""
    grid = tuple(int(g) for g in grid)
    note = ""
    count = int(round(density * np.prod(grid)))
    if cap is not None and count > cap:
        scale = np.sqrt(cap / count)
        shrunk = (grid[0],) + tuple(max(3, int(g * scale)) for g in grid[1:]) if len(grid) == 3 else \
            tuple(max(3, int(g * scale)) for g in grid)
        note = f"capped at ~{cap:,} voxels: grid {'x'.join(map(str, grid))} shrunk to {'x'.join(map(str, shrunk))}, same density"
        grid = shrunk
        count = int(round(density * np.prod(grid)))
    sites = rng.choice(int(np.prod(grid)), size=count, replace=False)
    sites.sort()
    coords = np.column_stack([np.zeros(count, np.int64), *np.unravel_index(sites, grid)]).astype(np.int64)
    return coords, grid, note


def turned_sites(sites: np.ndarray, grid: tuple, angle: float) -> np.ndarray:
    """Sites (z, y, x) turned about the sensor (the grid's centre in y, x) by `angle` in (y, x), rounded
    to the grid; some may fall outside it."""
    centre = (np.array(grid[1:], np.float64) - 1) / 2
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    yx = np.rint((sites[:, 1:] - centre) @ rotation.T + centre).astype(np.int64)
    return np.column_stack([sites[:, :1], yx])


def turned_frame(features: np.ndarray, coords: np.ndarray, grid: tuple, angle: float):
    """The frame (features, coords of batch 0) as if the sensor had turned by `angle`: a new scene with the
    real one's density and neighbourhoods. Sites that leave the grid or merge with another are dropped."""
    sites = turned_sites(coords[:, 1:].astype(np.int64), grid, angle)
    inside = np.flatnonzero(np.all((sites >= 0) & (sites < np.array(grid)), axis=1))
    _, first = np.unique(sites[inside], axis=0, return_index=True)
    kept = inside[np.sort(first)]
    return features[kept], np.column_stack([coords[kept, :1], sites[kept]]).astype(coords.dtype)


def scaled_frame(coords: np.ndarray, grid: tuple, count: int) -> np.ndarray:
    """`count` voxels that look like the real frame `coords` (batch 0, grid z, y, x): fewer are its
    `count` voxels nearest the sensor (the grid's centre in y, x), which keeps the local density and
    the neighbour counts; more add copies of the frame turned about the sensor in (y, x) by even steps,
    as if the scene had more beams, before the same cut. Sorted, distinct, inside the grid."""
    centre = (np.array(grid[1:], np.float64) - 1) / 2
    sites = coords[:, 1:].astype(np.int64)
    copies = 1
    while True:
        found = np.concatenate([turned_sites(sites, grid, angle) for angle in 2 * np.pi * np.arange(copies) / copies])
        found = np.unique(found[np.all((found >= 0) & (found < np.array(grid)), axis=1)], axis=0)
        if len(found) >= count:
            break
        copies *= 2
    order = np.argsort(((found[:, 1:] - centre) ** 2).sum(axis=1), kind="stable")[:count]
    kept = found[np.sort(order)]
    return np.column_stack([np.zeros(len(kept), np.int64), kept])


SCALING_COUNTS = (10_000, 20_000, 40_000, 80_000, 160_000, 320_000, 640_000, 1_000_000)


def _frame(name: str):
    path = find_data(name)
    if path is None:
        raise Skip(f"{name} not found ($SPARSE_LOWER_DATA or ../shared/data)")
    return load_voxels(path)


# --- single layers ---------------------------------------------------------------------------------

def _geometry(spec: LayerSpec):
    """(op_type, kernel, attrs for the builder) of a spec, ignoring the inverse's output padding."""
    if spec.kind == "subm":
        return "SubmanifoldConv", 3, {}
    if spec.kind == "strided":
        return "SparseConv", 3, {"strides": 2, "pads": 1}
    if spec.kind == "transposed":
        return "SparseDeconv", 2, {"strides": 2, "pads": 0}
    return "SparseDeconv", 3, {"strides": 2, "pads": 1}


def _coarse(coords: np.ndarray, grid: tuple) -> tuple[np.ndarray, tuple]:
    """The output coords and grid of a 3^d s2 p1 SparseConv on `coords` (the inverse conv's input)."""
    ndim = len(grid)
    fine = coords[:, 1:]
    taps = np.stack(np.meshgrid(*([np.arange(3)] * ndim), indexing="ij"), -1).reshape(-1, ndim)
    out_grid = tuple((g + 2 - 3) // 2 + 1 for g in grid)
    candidates = (fine[:, None, :] + 1 - taps[None]).reshape(-1, ndim)
    keep = np.all(candidates % 2 == 0, axis=1)
    out = candidates[keep] // 2
    out = out[np.all((out >= 0) & (out < np.array(out_grid)), axis=1)]
    out = np.unique(out, axis=0)
    return np.column_stack([np.zeros(len(out), np.int64), out]).astype(np.int64), out_grid


def _layer_model(spec: LayerSpec, grid: tuple, seed: int):
    ndim = len(grid)
    op_type, k, attrs = _geometry(spec)
    geometry = {}
    if "strides" in attrs:
        geometry = {"strides": [attrs["strides"]] * ndim, "pads": [attrs["pads"]] * (2 * ndim)}
    builder = SparseModelBuilder(ndim, spec.cin, np.random.default_rng(seed))
    if spec.kind != "inverse":
        builder.conv(op_type, spec.cout, (k,) * ndim, grid, bias=False, **geometry)
        return builder.build(f"bench_{spec.kind}")
    # inverse: SparseDeconv whose outputs are the given fine coords (TargetMap), input on the coarse grid
    coarse_grid = tuple((g + 2 - 3) // 2 + 1 for g in grid)
    output_padding = [g - (2 * (c - 1) + 3 - 2) for g, c in zip(grid, coarse_grid)]
    builder.conv(op_type, spec.cout, (k,) * ndim, coarse_grid, bias=False, output_padding=output_padding, **geometry)
    model = builder.build(f"bench_{spec.kind}")
    node = model.graph.node[0]
    node.input.extend(["", "target_coords"])  # no bias, then the target coords
    model.graph.input.append(helper.make_tensor_value_info("target_coords", TensorProto.INT64, ["M", 1 + ndim]))
    onnx.checker.check_model(model)
    return model


def _spconv_layer(spec: LayerSpec, ndim: int):
    """A zero-argument run function factory for plain spconv modules (ImportError when absent)."""

    def factory(features: np.ndarray, coords: np.ndarray, grid: tuple, fine=None):
        import spconv.pytorch as spconv
        import torch

        from ..exporter.spconv_calls import spconv_inference

        d = f"{ndim}d"
        if spec.kind == "subm":
            module = getattr(spconv, f"SubMConv{d}")(spec.cin, spec.cout, 3, bias=False)
        elif spec.kind == "strided":
            module = getattr(spconv, f"SparseConv{d}")(spec.cin, spec.cout, 3, stride=2, padding=1, bias=False)
        elif spec.kind == "transposed":
            module = getattr(spconv, f"SparseConvTranspose{d}")(spec.cin, spec.cout, 2, stride=2, bias=False)
        else:
            module = getattr(spconv, f"SparseInverseConv{d}")(spec.cin, spec.cout, 3, indice_key="down", bias=False)
        feats = torch.from_numpy(np.ascontiguousarray(features, np.float32))
        indices = torch.from_numpy(np.ascontiguousarray(coords, np.int32))

        if spec.kind != "inverse":
            def run():
                with spconv_inference(module):
                    out = module(spconv.SparseConvTensor(feats, indices, list(grid), 1))
                return out.features.shape[0]
            return run
        # spconv's inverse conv reuses the pairs of its forward conv (its design): run the forward once
        fine_coords, fine_grid = fine
        forward = getattr(spconv, f"SparseConv{d}")(spec.cout, spec.cin, 3, stride=2, padding=1, bias=False,
                                                    indice_key="down")
        fine_feats = torch.zeros((len(fine_coords), spec.cout), dtype=torch.float32)
        with spconv_inference(forward):
            down = forward(spconv.SparseConvTensor(fine_feats, torch.from_numpy(fine_coords.astype(np.int32)),
                                                   list(fine_grid), 1))
        down = down.replace_feature(torch.from_numpy(np.ascontiguousarray(features, np.float32)))
        if down.features.shape[0] != len(features):
            raise Skip("spconv's strided conv gave another row count than ours")

        def run_inverse():
            with spconv_inference(module):
                out = module(down)
            return out.features.shape[0]
        return run_inverse

    return factory


def _dense_layer(spec: LayerSpec, grid: tuple, features: np.ndarray, coords: np.ndarray, budget_flops: float,
                 budget_bytes: float):
    """The dense onnxruntime Conv/ConvTranspose of the whole grid (the densify is not timed)."""
    ndim = len(grid)
    op_type, k, attrs = _geometry(spec)
    sites = int(np.prod(grid))
    taps = k ** ndim
    if spec.kind in ("transposed", "inverse"):
        out_sites = sites * 2 ** ndim if spec.kind == "transposed" else int(np.prod([2 * g - 1 for g in grid]))
        flops = 2.0 * sites * taps * spec.cin * spec.cout  # every input site scatters to all taps
    else:
        out_sites = sites if spec.kind == "subm" else int(np.prod([(g - 1) // 2 + 1 for g in grid]))
        flops = 2.0 * out_sites * taps * spec.cin * spec.cout
    nbytes = 4.0 * (sites * spec.cin + out_sites * spec.cout)
    if flops > budget_flops:
        raise Skip(f"dense grid {'x'.join(map(str, grid))} needs {flops / 1e9:.0f} GFLOP per run "
                   f"(budget {budget_flops / 1e9:.0f})")
    if nbytes > budget_bytes:
        raise Skip(f"dense tensors need {nbytes / 2**30:.1f} GiB (budget {budget_bytes / 2**30:.1f})")
    rng = np.random.default_rng(1)
    if spec.kind in ("transposed", "inverse"):
        weight = rng.standard_normal((spec.cin, spec.cout) + (k,) * ndim).astype(np.float32)
        node_attrs = {"kernel_shape": [k] * ndim, "strides": [2] * ndim, "pads": [attrs["pads"]] * (2 * ndim)}
        node = helper.make_node("ConvTranspose", ["X", "W"], ["Y"], **node_attrs)
    else:
        weight = rng.standard_normal((spec.cout, spec.cin) + (k,) * ndim).astype(np.float32)
        pads = attrs.get("pads", 1)
        node = helper.make_node("Conv", ["X", "W"], ["Y"], kernel_shape=[k] * ndim,
                                strides=[attrs.get("strides", 1)] * ndim, pads=[pads] * (2 * ndim))
    graph = helper.make_graph([node], "dense", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                                             [1, spec.cin, *grid])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(weight, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    dense = np.zeros((1, spec.cin) + tuple(grid), np.float32)
    dense[0][(slice(None),) + tuple(coords[:, 1:].T)] = features.T
    return model, {"X": dense}


def layer_case(spec: LayerSpec, data: Callable, name: str, group: str, budget) -> Case:
    """`data()` returns (coords, grid, note) of the layer's input (for inverse: of the fine tensor)."""

    def build() -> Built:
        coords, grid, note = data()
        rng = np.random.default_rng(0)
        feeds = {}
        fine = None
        in_grid = grid
        if spec.kind == "inverse":
            fine = (coords, grid)
            feeds["target_coords"] = coords
            coords, in_grid = _coarse(coords, grid)
        features = rng.standard_normal((len(coords), spec.cin)).astype(np.float32)
        feeds = {"features": features, "coords": coords, **feeds}
        source = _layer_model(spec, grid, seed=0)
        factory = _spconv_layer(spec, len(grid))
        dense_grid = in_grid
        return Built(source=source, feeds=feeds,
                     spconv=lambda: factory(features, coords, in_grid, fine),
                     minkowski=lambda: minkowski.layer_runner(spec.kind, spec.cin, spec.cout, features, coords, fine),
                     dense=lambda: _dense_layer(spec, dense_grid, features, coords, *budget),
                     rows_in=len(coords), grid=tuple(in_grid), note=note)

    return Case(name, group, build, spec.label)


def network_case(network: str, frame: str | None, name: str, random=None, count: int | None = None,
                 group: str = "network") -> Case:
    """`network` is `centerpoint` (sp_middle_resnet_fhd), `unet` (sparse_unet) or `voxelnext`; on a real `frame`
    (`count` voxels made from it by `scaled_frame` when given) or on `random = (grid, density, cap)`
    voxels."""
    builder = {"centerpoint": sp_middle_resnet_fhd, "unet": sparse_unet, "voxelnext": voxelnext}[network]

    def build() -> Built:
        note = ""
        if frame is not None:
            features, coords, grid = _frame(frame)
            if count is not None:
                coords = scaled_frame(coords, grid, count)
                features = np.random.default_rng(1).standard_normal((len(coords), 5)).astype(np.float32)
                note = f"{count:,} voxels made from the {frame} frame (bench.cases.scaled_frame)"
        else:
            coords, grid, note = random_voxels(*random[:2], np.random.default_rng(0), random[2])
            features = np.random.default_rng(1).standard_normal((len(coords), 5)).astype(np.float32)
        source = builder(CanonicalEmitter(), np.random.default_rng(0), spatial_shape=grid)

        def spconv_factory():
            from ..models.spconv_emitter import SpconvEmitter  # torch, spconv: ImportError names the missing

            net = builder(SpconvEmitter(), np.random.default_rng(0), spatial_shape=grid)

            def run():
                out = net(features, coords)
                return out[0][0].shape[0] if isinstance(out[0], tuple) else None
            return run

        def minkowski_factory():
            if network != "centerpoint":
                raise Skip(f"no MinkowskiEngine version of the {network} network")
            return minkowski.centerpoint_runner(features, coords)

        return Built(source=source, feeds={"features": features, "coords": coords}, spconv=spconv_factory,
                     minkowski=minkowski_factory, dense=None, rows_in=len(coords), grid=tuple(grid), note=note)

    return Case(name, group, build, f"{network} network")


def minkunet_case(frame: str, name: str) -> Case:
    """The MinkUNet of bench/minkunet.py on a real frame: ours (its export), MinkowskiEngine and TorchSparse."""

    def build() -> Built:
        features, coords, grid = _frame(frame)
        try:
            source, feeds = minkunet.source_model(features, coords, grid)
        except ImportError as error:
            raise Skip(f"the MinkUNet row needs MinkowskiEngine or TorchSparse ({error})") from error

        def spconv_factory():
            raise Skip("no spconv version of the MinkUNet: its strided sites are spconv's rule, not the floor rule")

        return Built(source=source, feeds=feeds, spconv=spconv_factory,
                     minkowski=lambda: minkunet.runner("minkowski", features, coords),
                     torchsparse=lambda: minkunet.runner("torchsparse", features, coords), dense=None,
                     rows_in=len(coords), grid=tuple(grid))

    return Case(name, "network", build, "MinkUNet (MinkowskiEngine's MinkUNet14 layout)")


def pointcept_case(network: str, frame: str, name: str, ours: str = "ours-gpu-auto-2threads") -> Case:
    """Pointcept's `network` (checkouts/pointcept.py, from $SPARSE_LOWER_POINTCEPT) on a real frame: ours (its
    export on the gpu target) against the module in PyTorch, or (`ours` "ours-portable-2threads") the
    portable form alone: a case holds one of our sessions, each GiBs of attention rows (two and the
    module's, Sonata's on the CenterPoint frame, pass this machine's 24 GiB)."""

    def build() -> Built:
        try:
            from ..checkouts import pointcept

            module = pointcept.build(pointcept.checkout(), network)
        except (ImportError, SparseLowerError) as error:
            raise Skip(f"the {network} row needs Pointcept's source and torch-scatter ({error})") from error
        features, _, _ = _frame(frame)
        parts = [pointcept.grid_sampled(features)]  # as Pointcept's pipeline grids it
        coords = parts[0][1]
        grid = tuple(int(v) + 1 for v in coords[:, 1:].max(0))
        feeds = {key: value.numpy() for key, value in pointcept.point_input(parts, module.channels).items()}

        def no_spconv():
            raise Skip(f"{network} is Pointcept's module: its PyTorch rows are the pointcept systems")

        peer = None if ours == "ours-portable-2threads" else \
            (lambda threads: pointcept.module_runner(module, parts, threads))
        return Built(source=pointcept.export(module, parts), feeds=feeds, spconv=no_spconv, minkowski=no_spconv,
                     dense=None, rows_in=len(coords), grid=tuple(grid), pointcept=peer, ours=(ours,))

    what = {"PTv3": "Pointcept's PT-v3m1, nuScenes configuration", "Sonata": "Sonata's encoder, PT-v3m2"}[network]
    return Case(name, "network", build, f"{network} ({what}, GridSample at 0.05 m)")


def all_cases(quick: bool = False, dense_budget=(40e9, 3 * 2**30)) -> list[Case]:
    cases = []
    if quick:
        grid = (11, 40, 40)
        for spec in (LAYERS[0], LAYERS[2], LAYERS[3], LAYERS[4]):
            cases.append(layer_case(spec, lambda: random_voxels(grid, 0.1, np.random.default_rng(0), QUICK_CAP),
                                    f"{spec.kind}{spec.cin}-{spec.cout}/random10%-tiny", "layer-random",
                                    dense_budget))
        cases.append(layer_case(LAYERS[0], lambda: random_voxels((100, 100), 0.1, np.random.default_rng(0), None),
                                "subm16-16/2d-100x100-90%", "layer-2d", dense_budget))
        cases.append(network_case("unet", None, "unet/random-tiny", ((41, 48, 48), 0.02, QUICK_CAP)))
        return cases

    def real(spec):
        return lambda: (*_frame(CENTERPOINT_FILE)[1:], "")

    for spec in LAYERS:
        tag = f"{spec.kind}{spec.cin}-{spec.cout}"
        cases.append(layer_case(spec, real(spec), f"{tag}/centerpoint", "layer-real", dense_budget))
    for density in (0.001, 0.01, 0.1):
        for spec in LAYERS:
            tag = f"{spec.kind}{spec.cin}-{spec.cout}"
            cases.append(layer_case(spec, lambda d=density: random_voxels(RANDOM_GRID, d, np.random.default_rng(0),
                                                                          RANDOM_CAP),
                                    f"{tag}/random{density * 100:g}%", "layer-random", dense_budget))
    for sparsity in (0.9, 0.99):
        cases.append(layer_case(LAYERS[0], lambda s=sparsity: random_voxels((1000, 1000), 1 - s,
                                                                           np.random.default_rng(0), None),
                                f"subm16-16/2d-1000x1000-{sparsity * 100:g}%", "layer-2d", dense_budget))
    for network in ("centerpoint", "unet", "voxelnext"):
        for frame, label in ((CENTERPOINT_FILE, "centerpoint-frame"), (BEVFUSION_FILE, "bevfusion-frame")):
            cases.append(network_case(network, frame, f"{network}/{label}"))
    for frame, label in ((CENTERPOINT_FILE, "centerpoint-frame"), (BEVFUSION_FILE, "bevfusion-frame")):
        cases.append(minkunet_case(frame, f"minkunet/{label}"))
    for network in ("PTv3", "Sonata"):
        for frame, label in ((CENTERPOINT_FILE, "centerpoint-frame"), (BEVFUSION_FILE, "bevfusion-frame")):
            cases.append(pointcept_case(network, frame, f"{network.lower()}/{label}"))
            cases.append(pointcept_case(network, frame, f"{network.lower()}-portable/{label}", "ours-portable-2threads"))
    return cases


def scaling_cases(counts=SCALING_COUNTS) -> list[Case]:
    """The CenterPoint backbone on real-frame-like voxel sets of every size in `counts`."""
    return [network_case("centerpoint", CENTERPOINT_FILE, f"centerpoint/{n // 1000}k", count=n, group="scaling")
            for n in counts]


def select(cases: list[Case], pattern: str | None) -> list[Case]:
    """Cases whose name matches any comma-separated glob (substring match when there is no wildcard)."""
    if not pattern:
        return cases
    parts = [p.strip() for p in pattern.split(",") if p.strip()]
    return [c for c in cases if any(fnmatch.fnmatch(c.name, p if any(ch in p for ch in "*?[") else f"*{p}*")
                                    for p in parts)]
