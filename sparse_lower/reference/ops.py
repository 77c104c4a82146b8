"""The source ops (docs/source_ops.md) in NumPy: the executable definition the lowering is checked against.

Every function reads its attributes through `sparse_lower.schemas`, so an attribute means here exactly
what it means to the lowering, and a bad one is refused with the same SparseLowerError. Nothing else is
shared with the lowering: this module is the independent side of every comparison.

Active sites are found through sorted int64 linear keys and `searchsorted`, never through a dense grid
of the spatial extent, so a 41×1440×1440 LiDAR grid costs memory in proportion to its active voxels.
Each convolution is written as the pairs (kernel tap, input row, output row) it sums over:
`out[o] = B + Σ W_tap · x[i]`. Features are computed in float32 whatever float type comes in.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from math import prod

import numpy as np
from onnx import helper

from ..errors import SparseLowerError
from ..onnx_conventions import SOURCE_DOMAIN
from ..schemas import coalesce_attributes, conv_geometry, to_dense_attributes, weight_shape

__all__ = ["conv_pairs", "counting_pairs", "submanifold_conv", "sparse_conv", "sparse_deconv", "sparse_max_pool", "coalesce", "to_sparse",
           "to_dense"]


_TAP_PAIRS: ContextVar[dict | None] = ContextVar("tap_pairs", default=None)


@contextlib.contextmanager
def counting_pairs():
    """Inside: per conv node run (by name; a nameless or repeated name gets a number), the pairs each kernel
    tap multiplies, into the dict yielded. A check compares a tap's weights only where its inputs give it a
    pair: how many each tap met says what the check saw (verify.compare)."""
    counts: dict[str, np.ndarray] = {}
    token = _TAP_PAIRS.set(counts)
    try:
        yield counts
    finally:
        _TAP_PAIRS.reset(token)


def _counted(node, pairs):
    """`pairs`, their count per tap added to counting_pairs' record where one is kept."""
    counts = _TAP_PAIRS.get()
    if counts is not None:
        key = node.name or node.op_type
        counts[key if key not in counts else f"{key} #{len(counts)}"] = np.array(
            [len(inputs) for _, inputs, _ in pairs], np.int64)
    return pairs


def submanifold_conv(features, coords, weight, bias=None, *, kernel_shape, spatial_shape, strides=None,
                     pads=None, dilations=None, group=None, name=None):
    """SubmanifoldConv: a centred convolution evaluated only at the active input sites.

    `out[i] = B + Σ_k W[:, :, k] · x[j]` over the taps k whose neighbour
    `coords[j] = coords[i] + (k − (K−1)/2)·dilation` (same batch) is active. `pads` is ignored.
    Returns `(out_features [N, Cout], out_coords)` with `out_coords` = `coords` (same rows, same order).
    """
    node = _node("SubmanifoldConv", name, kernel_shape=kernel_shape, spatial_shape=spatial_shape,
                 strides=strides, pads=pads, dilations=dilations, group=group)
    geometry = conv_geometry(node)
    x, keys = _sparse_input(node, features, coords, geometry.spatial_shape)
    taps = _conv_taps(node, geometry, weight, x.shape[1])
    pairs = _counted(node, _submanifold_pairs(node, geometry, coords, keys))
    out = _accumulate(x, taps, _bias(node, bias, taps.shape[2]), len(coords), pairs)
    return out, coords.copy()


def sparse_conv(features, coords, weight, bias=None, *, kernel_shape, spatial_shape, strides=None,
                pads=None, dilations=None, group=None, output_sites=None, name=None):
    """SparseConv: a strided convolution whose output is active wherever some input reaches it (or, with
    `output_sites="floor"`, at each distinct `floor(i / s)` of an input i).

    Output site o receives input i through tap k when `i = o·s − pb + k·d` in every dimension and
    `0 <= o < S_out`. Returns `(out_features [M, Cout], out_coords [M, 1+D])`, rows sorted
    lexicographically by (batch, d0, d1, d2).
    """
    node = _node("SparseConv", name, kernel_shape=kernel_shape, spatial_shape=spatial_shape,
                 strides=strides, pads=pads, dilations=dilations, group=group, output_sites=output_sites)
    geometry = conv_geometry(node)
    x, _ = _sparse_input(node, features, coords, geometry.spatial_shape)
    taps = _conv_taps(node, geometry, weight, x.shape[1])
    pairs, out_coords = _strided_pairs(node, geometry, coords, None)
    return _accumulate(x, taps, _bias(node, bias, taps.shape[2]), len(out_coords), _counted(node, pairs)), out_coords


def sparse_deconv(features, coords, weight, bias=None, target_coords=None, *, kernel_shape, spatial_shape,
                  strides=None, pads=None, dilations=None, output_padding=None, group=None, name=None):
    """SparseDeconv: a transposed convolution, W in ONNX ConvTranspose layout [Cin, Cout, *K].

    Input i sends `W[:, :, k]ᵀ · x[i]` to `o = i·s − pb + k·d` when `0 <= o < S_out`. Without
    `target_coords` the output is every site that receives something, sorted lexicographically. With
    `target_coords` (the submanifold inverse deconvolution) the output rows are exactly the targets, in
    their order, each B plus whatever lands on it; contributions landing elsewhere are dropped.
    """
    node = _node("SparseDeconv", name, kernel_shape=kernel_shape, spatial_shape=spatial_shape,
                 strides=strides, pads=pads, dilations=dilations, output_padding=output_padding, group=group)
    geometry = conv_geometry(node)
    x, _ = _sparse_input(node, features, coords, geometry.spatial_shape)
    taps = _conv_taps(node, geometry, weight, x.shape[1])
    pairs, out_coords = _strided_pairs(node, geometry, coords, target_coords)
    return _accumulate(x, taps, _bias(node, bias, taps.shape[2]), len(out_coords), _counted(node, pairs)), out_coords


def sparse_max_pool(features, coords, *, kernel_shape, spatial_shape, strides=None, pads=None, dilations=None,
                    submanifold=None, output_sites=None, name=None):
    """SparseMaxPool: the largest value of each channel over the active inputs of a pooling window.

    The output sites are SparseConv's for the same geometry (o is active when some active input i and
    tap k satisfy `i = o·s − pb + k·d`, or under `output_sites="floor"` the distinct `floor(i / s)`),
    sorted; with `submanifold=1` they are the input rows (same
    order) and each window is centred on its row, as a SubmanifoldConv's. `out[o, c]` is the maximum of
    `x[i, c]` over the window's active inputs only (inactive sites are not zeros here). Returns
    `(out_features [M, C], out_coords [M, 1+D])`.
    """
    node = _node("SparseMaxPool", name, kernel_shape=kernel_shape, spatial_shape=spatial_shape, strides=strides,
                 pads=pads, dilations=dilations, submanifold=submanifold, output_sites=output_sites)
    geometry = conv_geometry(node)
    x, keys = _sparse_input(node, features, coords, geometry.spatial_shape)
    if geometry.submanifold:
        pairs, out_coords = _submanifold_pairs(node, geometry, coords, keys), coords.copy()
    else:
        pairs, out_coords = _strided_pairs(node, geometry, coords, None)
    out = np.full((len(out_coords), x.shape[1]), -np.inf, np.float32)
    for _, inputs, outputs in pairs:  # one tap: no output twice
        out[outputs] = np.maximum(out[outputs], x[inputs])
    return out, out_coords


def coalesce(features, coords, *, spatial_shape, reduction=None, name=None):
    """Coalesce: one row per distinct site, the rows sharing it summed (`reduction="sum"`, the default) or
    their per-channel maximum taken (`"max"`).

    Unlike every other op, the input rows may repeat a site (that is what it is for: a concatenation of
    sparse tensors on one grid, or coordinates with a dimension dropped). Returns
    `(out_features [M, C], out_coords [M, 1+D])`, the distinct sites sorted.
    """
    node = _node("Coalesce", name, spatial_shape=spatial_shape, reduction=reduction)
    merge = coalesce_attributes(node)
    x, _ = _sparse_input(node, features, coords, merge.spatial_shape, unique=False)
    keys = _linear_keys(node, coords, merge.spatial_shape)
    out_keys, owner = np.unique(keys, return_inverse=True)
    if merge.reduction == "sum":
        out = np.zeros((len(out_keys), x.shape[1]), np.float32)
        np.add.at(out, owner.reshape(-1), x)
    else:
        out = np.full((len(out_keys), x.shape[1]), -np.inf, np.float32)
        np.maximum.at(out, owner.reshape(-1), x)
    return out, _coords_from_keys(out_keys, merge.spatial_shape)


def conv_pairs(node, coords, target_coords=None):
    """The pairs a source conv node (a NodeProto) sums over on `coords`: per kernel tap, (tap, input
    rows, output rows), with the output coords. What the three conv ops accumulate; the nna target's
    pairs combine multiplies exactly these (`capacity.pair_rows` counts them)."""
    geometry = conv_geometry(node)
    keys = _check_coords(node, coords, geometry.spatial_shape, "coords")
    if node.op_type == "SubmanifoldConv":
        return _submanifold_pairs(node, geometry, coords, keys), coords.copy()
    return _strided_pairs(node, geometry, coords, target_coords)


def _submanifold_pairs(node, geometry, coords, keys):
    """Per tap, the rows whose neighbour `coords + (tap − centre)·dilation` is active, and that neighbour."""
    grid = np.asarray(geometry.spatial_shape)
    centre = (np.asarray(geometry.kernel_shape) - 1) // 2
    find = _finder(keys)
    pairs = []
    for t, tap in enumerate(np.ndindex(*geometry.kernel_shape)):
        neighbour = coords[:, 1:] + (np.asarray(tap) - centre) * geometry.dilations
        inside = np.flatnonzero(np.all((neighbour >= 0) & (neighbour < grid), axis=1))
        query = np.concatenate([coords[inside, :1], neighbour[inside]], axis=1)
        source = find(_linear_keys(node, query, geometry.spatial_shape))
        found = source >= 0
        pairs.append((t, source[found], inside[found]))
    return pairs


def _strided_pairs(node, geometry, coords, target_coords):
    """The pairs and output coords of a SparseConv (`i = o·s − pb + k·d`) or a SparseDeconv
    (`o = i·s − pb + k·d`): per tap, the input rows landing inside the output grid and their sites. Under
    the floor rule the output sites are the distinct `floor(i / s)`, sorted."""
    n = geometry.ndim
    strides_, pad_begin = np.asarray(geometry.strides), np.asarray(geometry.pads[:n])
    reached = []
    for tap in np.ndindex(*geometry.kernel_shape):
        if geometry.op_type == "SparseDeconv":
            site = coords[:, 1:] * strides_ - pad_begin + np.asarray(tap) * geometry.dilations
            hits = np.all((site >= 0) & (site < geometry.output_shape), axis=1)
        else:
            numerator = coords[:, 1:] + pad_begin - np.asarray(tap) * geometry.dilations
            site = numerator // strides_
            hits = np.all((numerator % strides_ == 0) & (site >= 0) & (site < geometry.output_shape), axis=1)
        reached.append((np.flatnonzero(hits), site[hits]))
    if geometry.floor:  # the outputs are given, the distinct floor(i / s); what lands elsewhere is dropped
        floors = np.concatenate([coords[:, :1], coords[:, 1:] // strides_], axis=1)
        target_coords = _coords_from_keys(np.unique(_linear_keys(node, floors, geometry.output_shape)),
                                          geometry.output_shape)
    return _output_pairs(node, coords, geometry.output_shape, reached, target_coords)


def to_sparse(x, *, name=None):
    """ToSparse: the sites of a dense `[B, C, *S]` tensor where any channel is non-zero.

    Returns `(features [N, C] float32, coords [N, 1+D] int64)`, sorted lexicographically.
    """
    node = _node("ToSparse", name)
    x = np.asarray(x)
    if not 3 <= x.ndim <= 5 or not np.issubdtype(x.dtype, np.floating):
        raise SparseLowerError(f"input must be a float tensor [B, C, *S] with 1 to 3 spatial dims, got "
                               f"{x.dtype} {list(x.shape)}", node.name, "pass a dense NC(D)HW float tensor")
    active = np.any(x != 0, axis=1)
    channels_last = np.moveaxis(x, 1, -1)
    return channels_last[active].astype(np.float32), np.argwhere(active).astype(np.int64)


def to_dense(features, coords, *, spatial_shape, batch_size, name=None):
    """ToDense: scatter the rows of a sparse tensor into a zero `[batch_size, C, *spatial_shape]` tensor."""
    node = _node("ToDense", name, spatial_shape=spatial_shape, batch_size=batch_size)
    boundary = to_dense_attributes(node)
    x, _ = _sparse_input(node, features, coords, boundary.spatial_shape)
    if len(coords) and coords[:, 0].max() >= boundary.batch_size:
        raise SparseLowerError(f"coords hold batch index {coords[:, 0].max()} but batch_size is "
                               f"{boundary.batch_size}", node.name, "raise batch_size")
    dense = np.zeros((boundary.batch_size, *boundary.spatial_shape, x.shape[1]), np.float32)
    dense[tuple(coords.T)] = x
    return np.ascontiguousarray(np.moveaxis(dense, -1, 1))


def _node(op_type, name, **attrs):
    """A NodeProto carrying the given attributes, so that schemas validates them as for a graph node."""
    given = {key: value for key, value in attrs.items() if value is not None}
    return helper.make_node(op_type, [], [], name=name or op_type, domain=SOURCE_DOMAIN, **given)


def _sparse_input(node, features, coords, spatial_shape, unique=True):
    """Check a sparse tensor (§2; with `unique=False` its rows may repeat a site) and return its features
    as float32 and its rows' linear keys."""
    features = np.asarray(features)
    keys = _check_coords(node, coords, spatial_shape, "coords", unique_rows=unique)
    if features.ndim != 2 or not np.issubdtype(features.dtype, np.floating):
        raise SparseLowerError(f"features must be a float matrix [N, C], got {features.dtype} "
                               f"{list(features.shape)}", node.name, "pass float32 (or float16) features")
    if len(features) != len(coords):
        raise SparseLowerError(f"features have {len(features)} rows but coords have {len(coords)}",
                               node.name, "give one coordinate row per feature row")
    return features.astype(np.float32), keys


def _check_coords(node, coords, spatial_shape, what, unique_rows=True):
    """Check int64 [N, 1+D] coordinates inside the grid, with unique rows unless told otherwise; return their
    linear keys."""
    ndim = len(spatial_shape)
    if not isinstance(coords, np.ndarray) or coords.dtype != np.int64 or coords.ndim != 2 \
            or coords.shape[1] != 1 + ndim:
        shape = list(np.shape(coords))
        raise SparseLowerError(f"{what} must be int64 [N, {1 + ndim}], got "
                               f"{getattr(coords, 'dtype', type(coords).__name__)} {shape}",
                               node.name, f"pass int64 rows (batch, d0..d{ndim - 1})")
    outside = (coords[:, 0] < 0) | np.any((coords[:, 1:] < 0) | (coords[:, 1:] >= spatial_shape), axis=1)
    if outside.any():
        row = int(np.flatnonzero(outside)[0])
        raise SparseLowerError(f"{what} row {row} {coords[row].tolist()} lies outside the grid "
                               f"{list(spatial_shape)} (or has a negative batch)", node.name,
                               f"keep 0 <= d_i < {list(spatial_shape)}[i] and batch >= 0")
    keys = _linear_keys(node, coords, spatial_shape)
    unique, counts = np.unique(keys, return_counts=True)
    if unique_rows and (counts > 1).any():
        row = int(np.flatnonzero(keys == unique[counts > 1][0])[1])
        raise SparseLowerError(f"{what} row {row} {coords[row].tolist()} is duplicated", node.name,
                               "give each site once (merge duplicate rows with a Coalesce beforehand)")
    return keys


def _linear_keys(node, coords, spatial_shape):
    """Row-major index of (batch, d0, d1, d2) in the grid: orders keys exactly as rows sort lexicographically."""
    batches = int(coords[:, 0].max()) + 1 if len(coords) else 1
    if batches * prod(spatial_shape) >= 2 ** 63:
        raise SparseLowerError(f"the grid {list(spatial_shape)} times {batches} batches overflows int64 keys",
                               node.name, "use a smaller grid")
    keys = coords[:, 0].copy()
    for axis, extent in enumerate(spatial_shape):
        keys = keys * extent + coords[:, 1 + axis]
    return keys


def _coords_from_keys(keys, spatial_shape):
    """The inverse of `_linear_keys` (the batch is what remains after the spatial dimensions)."""
    columns = []
    for extent in reversed(spatial_shape):
        keys, column = np.divmod(keys, extent)
        columns.append(column)
    return np.stack([keys, *reversed(columns)], axis=1).astype(np.int64).reshape(-1, 1 + len(spatial_shape))


def _finder(keys):
    """A function giving, for each query key, the row of `keys` that holds it, or -1 where none does.

    `keys` is sorted once; every query is then a binary search (the hash map of a GPU rulebook builder).
    """
    order = np.argsort(keys)
    ordered = keys[order]

    def find(query):
        if not len(ordered):
            return np.full(len(query), -1, np.int64)
        position = np.minimum(np.searchsorted(ordered, query), len(ordered) - 1)
        return np.where(ordered[position] == query, order[position], -1)

    return find


def _conv_taps(node, geometry, weight, cin):
    """The weight as one [Cin, Cout] matrix per kernel tap (taps in row-major kernel order)."""
    weight = np.asarray(weight)
    cout = weight.shape[1] if geometry.op_type == "SparseDeconv" else weight.shape[0]
    expected = weight_shape(geometry, cin, cout) if weight.ndim == 2 + geometry.ndim else None
    if weight.shape != expected:
        layout = "[Cin, Cout, *K]" if geometry.op_type == "SparseDeconv" else "[Cout, Cin, *K]"
        raise SparseLowerError(f"weight shape {list(weight.shape)} does not fit {cin} input channels and "
                               f"kernel {list(geometry.kernel_shape)}", node.name, f"give W as {layout}")
    matrices = weight.astype(np.float32).reshape(weight.shape[0], weight.shape[1], -1)
    if geometry.op_type == "SparseDeconv":
        return np.moveaxis(matrices, 2, 0)
    return np.moveaxis(matrices, 2, 0).transpose(0, 2, 1)


def _bias(node, bias, cout):
    """The bias as float32 [Cout]; zeros when the optional input is absent."""
    if bias is None:
        return np.zeros(cout, np.float32)
    bias = np.asarray(bias)
    if bias.shape != (cout,):
        raise SparseLowerError(f"bias shape {list(bias.shape)} does not match {cout} output channels",
                               node.name, f"give B as [{cout}] or leave it out")
    return bias.astype(np.float32)


def _accumulate(x, taps, bias, rows, pairs):
    """`out[o] = bias + Σ x[i] @ taps[t]` over the (tap t, input rows i, output rows o) pairs.

    For one tap, the map from input site to output site is a translation (and a scaling by the
    stride), so no output row appears twice in one tap's list and the fancy-indexed `+=` is exact.
    """
    out = np.tile(bias, (rows, 1))
    for t, inputs, outputs in pairs:
        out[outputs] += x[inputs] @ taps[t]
    return out


def _output_pairs(node, coords, output_shape, reached, target_coords):
    """The pairs of a SparseConv / SparseDeconv on their output sites, and those sites.

    `reached` holds, per tap, the input rows that land inside the output grid and the sites they land
    on. The output rows are the targets when given, else every reached site in lexicographic order.
    """
    site_keys = [_linear_keys(node, np.concatenate([coords[rows, :1], sites], axis=1), output_shape)
                 for rows, sites in reached]
    if target_coords is None:
        out_keys = np.unique(np.concatenate(site_keys))
        out_coords = _coords_from_keys(out_keys, output_shape)
        positions = [np.searchsorted(out_keys, keys) for keys in site_keys]
    else:
        out_coords = target_coords.copy()
        out_keys = _check_coords(node, target_coords, output_shape, "target_coords")
        find = _finder(out_keys)
        positions = [find(keys) for keys in site_keys]
    pairs = [(t, rows[position >= 0], position[position >= 0])
             for t, ((rows, _), position) in enumerate(zip(reached, positions))]
    return pairs, out_coords
