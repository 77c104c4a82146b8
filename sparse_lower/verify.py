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
    """`count` distinct sites of a `batch × grid` volume, in random order, as int64 coords."""
    volume = int(np.prod(grid))
    count = min(count, batch * volume)
    sites = rng.choice(batch * volume, size=count, replace=False)
    return np.column_stack([sites // volume, *np.unravel_index(sites % volume, grid)]).astype(np.int64)


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


@dataclass
class Difference:
    output: str
    max_abs: float
    max_rel: float
    shape_ok: bool


def cast_feed(value: np.ndarray, dtype) -> np.ndarray | None:
    """`value` as `dtype` where that is the cast the user means (float16 or float64 features to float32;
    int32 coordinates to int64, or any integer cast that changes no value), else None."""
    value, dtype = np.asarray(value), np.dtype(dtype)
    if value.dtype == dtype:
        return value
    if not (value.dtype.kind == dtype.kind or {value.dtype.kind, dtype.kind} <= {"i", "u"}):
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


def compare(model: onnx.ModelProto, lowered: onnx.ModelProto, feeds: dict, **session_kwargs) -> list[Difference]:
    """Run the reference on `model` and onnxruntime on `lowered`, output by output. A lowered model that
    imports no custom domain (the portable target) runs in a plain onnxruntime session, without the
    library: that is how its users run it. The feeds are cast to the lowered model's declared types (a
    model converted to float16 is lowered to take float32)."""
    expected = reference.run(model, feeds)
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
