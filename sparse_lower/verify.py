"""Checking a lowered model against the NumPy reference: example inputs for a sparse model, and the
comparison of both models' outputs. Used by `sparse-lower convert --verify` and by the demo."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import onnx

from . import reference
from .assumed_active import DEFAULT_ACTIVE
from .errors import SparseLowerError
from .input_roles import input_roles
from .model_io import fed_inputs
from .runtime import drop_padding, fixed_rows, pad_rows, session_for
from .onnx_conventions import IMPORT_KEY, SOURCE_DOMAIN
from .schemas import to_dense_attributes

_NP = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
       onnx.TensorProto.INT64: np.int64}


def _static_shape(value: onnx.ValueInfoProto) -> list:
    return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]


def random_coords(rng: np.random.Generator, count: int, batch: int, grid) -> np.ndarray:
    """`count` distinct sites of a `batch × grid` volume (all of them where it holds fewer), in random
    order, as int64 coords, drawn as a LiDAR frame lies: around one point per batch at every scale from one
    cell to a few times the count's D-th root (within half the grid), so that each kernel tap finds
    neighbour pairs at the first level and after every stride, and strided layers merge rows as a real
    frame's do rather than multiplying them. Sites drawn uniformly over a 41 × 1440 × 1440 grid have no
    neighbours: a check on them multiplies the centre taps alone and passes a lowering whose other taps
    are wrong."""
    grid = np.asarray(grid, np.int64)
    volume = int(np.prod(grid))
    count = min(count, batch * volume)
    widest = max(min(grid.max() / 2, 4 * max(count, 1) ** (1 / len(grid))), 1)  # a blob as dense as a frame's core
    scales = 2.0 ** np.arange(int(np.log2(widest)) + 1)
    anchors = rng.integers(0, grid, size=(batch, len(grid)))
    keys = np.empty(0, np.int64)
    for _ in range(8):  # each round draws twice what is missing; duplicates fall out
        if len(keys) == count:
            break
        b = rng.integers(0, batch, 2 * (count - len(keys)))
        spread = rng.standard_normal((len(b), len(grid))) * rng.choice(scales, (len(b), 1))
        sites = np.clip(anchors[b] + np.rint(spread).astype(np.int64), 0, grid - 1)
        keys = np.concatenate([keys, b * volume + np.ravel_multi_index(sites.T, grid)])
        keys = keys[np.sort(np.unique(keys, return_index=True)[1])][:count]
    while len(keys) < count:  # a grid the clusters cannot fill: the rest uniformly among the sites left
        rest = np.setdiff1d(np.arange(batch * volume), keys) if batch * volume <= 4 * count else \
            np.setdiff1d(rng.integers(0, batch * volume, 2 * (count - len(keys))), keys)
        keys = np.concatenate([keys, rng.permutation(rest)[:count - len(keys)]])
    keys = rng.permutation(keys)
    return np.column_stack([keys // volume, *np.unravel_index(keys % volume, grid)]).astype(np.int64)


def _described_coords(model: onnx.ModelProto) -> dict[str, dict]:
    """The coordinate inputs an imported model's metadata describes (columns, extents): a format whose
    coordinates reach the sparse layers through standard ops (Autoware's) says so there."""
    report = next((p.value for p in model.metadata_props if p.key == IMPORT_KEY), None)
    return json.loads(report).get("coords", {}) if report else {}


def _symbols(value: onnx.ValueInfoProto) -> list:
    return [d.dim_param if d.HasField("dim_param") else None for d in value.type.tensor_type.shape.dim]


def example_inputs(model: onnx.ModelProto, rng: np.random.Generator, active: int = DEFAULT_ACTIVE,
                   batch: int = 2) -> dict[str, np.ndarray]:
    """Random inputs for every graph input: unique coords inside each declared grid (in at most `batch`
    batches, and no more than any ToDense holds), features with the declared channels, dense inputs
    about 10 % active. Coordinates that an import described (see `_described_coords`) are drawn inside
    their extents, and the other inputs sharing their symbolic row count get as many rows."""
    roles = input_roles(model)
    described = _described_coords(model)
    batch = min([batch, *(to_dense_attributes(n).batch_size for n in model.graph.node
                          if n.domain == SOURCE_DOMAIN and n.op_type == "ToDense")])
    feeds: dict[str, np.ndarray] = {}
    rows_of: dict[str, int] = {}  # a symbolic dimension -> the rows drawn for it
    pending = fed_inputs(model)
    order = {"coords": 0, "described": 1, "features": 2, "other": 3}
    role_of = {v.name: ("described", None, None) if v.name in described else roles.get(v.name, ("other", None, None))
               for v in pending}
    for value in sorted(pending, key=lambda v: order[role_of[v.name][0]]):
        role, grid, partner = role_of[value.name]
        dtype = _NP.get(value.type.tensor_type.elem_type, np.float32)
        shape = _static_shape(value)
        if role == "coords":  # int64, or the type it is cast from (through a Cast to the source op)
            feeds[value.name] = random_coords(rng, active, batch, grid).astype(
                onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
        elif role == "described":
            feeds[value.name] = _described_sites(rng, described[value.name], active, batch).astype(
                onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
            symbol = _symbols(value)[0]
            if symbol:
                rows_of[symbol] = len(feeds[value.name])
        elif role == "features":
            rows = len(feeds[partner]) if partner in feeds else rows_of.get(_symbols(value)[0], active)
            feeds[value.name] = rng.standard_normal((rows, shape[1] or 1)).astype(dtype)
        elif None in shape and all(s is not None or rows_of.get(p) for s, p in zip(shape, _symbols(value))):
            shape = [s if s is not None else rows_of[p] for s, p in zip(shape, _symbols(value))]
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        elif None in shape:
            raise SparseLowerError(f"input '{value.name}' has a symbolic shape {shape} that cannot be guessed",
                                   fix="give inputs with --inputs FILE.npz, or skip the check with --no-verify")
        else:
            data = rng.standard_normal(shape).astype(dtype)
            if len(shape) >= 3:  # a dense grid: keep about 10 % of the sites active
                data *= rng.random([shape[0], 1, *shape[2:]]) < 0.1
            feeds[value.name] = data
    return feeds


def _described_sites(rng: np.random.Generator, description: dict, active: int, batch: int) -> np.ndarray:
    """Unique random coordinates laid out as `description` says: a "batch" column below `batch`, each
    other column inside its extent."""
    extents = [batch if extent is None else extent for extent in description["extents"]]
    volume = int(np.prod(extents))
    sites = rng.choice(volume, size=min(active, volume), replace=False)
    return np.column_stack(np.unravel_index(sites, extents)).astype(np.int64)


def non_finite(feeds: dict[str, np.ndarray]) -> str:
    """What of a frame's float inputs is NaN or infinite ("" where nothing is), e.g. "'features' holds 3
    NaN values in 2 rows"."""
    found = []
    for name, value in feeds.items():
        if value.dtype.kind != "f" or np.isfinite(value).all():
            continue
        nan, inf = int(np.isnan(value).sum()), int(np.isinf(value).sum())
        rows = int((~np.isfinite(value)).reshape(len(value), -1).any(axis=1).sum()) if value.ndim else 1
        kinds = " and ".join(part for part in (f"{nan} NaN" if nan else "", f"{inf} infinite" if inf else "") if part)
        found.append(f"'{name}' holds {kinds} value{'s' if nan + inf > 1 else ''} in {rows} row{'s' if rows > 1 else ''}")
    return "; ".join(found)


@dataclass
class Difference:
    output: str
    max_abs: float
    max_rel: float
    shape_ok: bool


def cast_feed(value: np.ndarray, dtype) -> np.ndarray | None:
    """`value` as `dtype` where that is the cast the user means (float16 or float64 features to float32;
    int32 coordinates to int64, float coordinates that hold whole numbers to int64, or any integer cast that
    changes no value), else None."""
    value, dtype = np.asarray(value), np.dtype(dtype)
    if value.dtype == dtype:
        return value
    whole = value.dtype.kind == "f" and dtype.kind in "iu" and bool(np.isfinite(value).all()) and \
        bool((value == np.round(value)).all()) and (not value.size or (
            np.iinfo(dtype).min <= value.min() and value.max() <= np.iinfo(dtype).max))
    if not (value.dtype.kind == dtype.kind or {value.dtype.kind, dtype.kind} <= {"i", "u"} or whole):
        return None
    cast = value.astype(dtype)
    return None if dtype.kind in "iu" and not np.array_equal(cast, value) else cast


def given_inputs(model: onnx.ModelProto, arrays: dict[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
    """The arrays of an inputs file (`source`) as feeds of `model`: each graph input by its name, cast
    to its declared type where the cast is the one the user means (int32 coordinates to int64 when no
    value changes; float16 or float64 features to float32). Arrays the model does not take are ignored;
    a missing input or a cast that would change the data is refused, naming the input."""
    declared = {v.name: v.type.tensor_type.elem_type for v in fed_inputs(model)}
    missing = [name for name in declared if name not in arrays]
    if missing:
        raise SparseLowerError(f"{source} has no array named {', '.join(map(repr, missing))} (it holds "
                               f"{', '.join(map(repr, sorted(arrays))) or 'none'}); the model's inputs are "
                               f"{', '.join(map(repr, declared))}",
                               fix="save the arrays under the model's input names: np.savez(FILE, name=array, ...)")
    feeds = {}
    for name, elem_type in declared.items():
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        feeds[name] = cast_feed(arrays[name], dtype)
        if feeds[name] is None:
            raise SparseLowerError(f"{source}: '{name}' is {np.asarray(arrays[name]).dtype} but the model takes "
                                   f"{dtype}, and casting would change its values", fix=f"save '{name}' as {dtype}")
    return feeds


def relative_error(have: np.ndarray, want: np.ndarray) -> float:
    """The largest absolute difference relative to the largest magnitude of `want` (inf when the shapes
    differ): one number per output that means the same for a feature map and a logit."""
    if have.shape != want.shape:
        return float("inf")
    worst = float(np.abs(have.astype(np.float64) - want.astype(np.float64)).max(initial=0.0))
    return worst / max(float(np.abs(want).max(initial=0.0)), 1e-12)


def snr_db(have: np.ndarray, want: np.ndarray) -> float:
    """Signal-to-noise ratio of `have` against `want` in dB (inf when equal): how quantized outputs are
    usually judged, over the whole output where `relative_error` takes the worst element."""
    noise = float(((have.astype(np.float64) - want.astype(np.float64)) ** 2).sum())
    return float("inf") if noise == 0 else 10 * float(np.log10(float((want.astype(np.float64) ** 2).sum()) / noise))


def compare(model: onnx.ModelProto, lowered: onnx.ModelProto, feeds: dict, taps: dict | None = None,
            **session_kwargs) -> list[Difference]:
    """Run the reference on `model` and onnxruntime on `lowered`, output by output. A lowered model that
    imports no custom domain (the portable target) runs in a plain onnxruntime session, without the
    library: that is how its users run it. The feeds are cast to the lowered model's declared types (a
    model converted to float16 is lowered to take float32). `taps`, where given, receives per conv node
    the pairs each kernel tap multiplied on the feeds (reference.counting_pairs; see tap_coverage)."""
    with reference.counting_pairs() as counted:
        expected = reference.run(model, feeds)
    if taps is not None:
        taps.update(counted)
    session = session_for(lowered, **session_kwargs)
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(names, pad_rows(lowered, given_inputs(lowered, feeds, "the inputs")))))
    if fixed_rows(lowered):
        got = drop_padding(got)
    differences = []
    for name, want in expected.items():
        have = got[name]
        if want.shape != have.shape:
            differences.append(Difference(name, float("inf"), float("inf"), False))
            continue
        worst = float(np.abs(have.astype(np.float64) - want.astype(np.float64)).max(initial=0.0))
        differences.append(Difference(name, worst, relative_error(have, want), True))
    return differences


def tap_coverage(taps: dict) -> tuple[str, bool]:
    """What a comparison's pair counts (compare's `taps`) say of the weights it checked, and whether every
    tap was: each tap of each convolution is compared only through the neighbour pairs the inputs give it."""
    if not taps:
        return "", True  # no convolution: nothing to say
    counts = np.concatenate(list(taps.values()))
    unseen = {name: np.flatnonzero(per_tap == 0) for name, per_tap in taps.items() if (per_tap == 0).any()}
    if not unseen:
        return (f"every tap of the {len(taps)} convolution{'s' if len(taps) > 1 else ''} multiplied neighbour "
                f"pairs ({counts.min()} to {counts.max()} per tap)"), True
    name, missing = next(iter(unseen.items()))
    return (f"{sum(len(m) for m in unseen.values())} of {len(counts)} kernel taps, in {len(unseen)} of {len(taps)} "
            f"convolutions (e.g. '{name}', taps {missing[:6].tolist()}), met no neighbour pair on these inputs: "
            "their weights were not compared"), False
