"""NumPy reference of the sparse_lower custom ops (docs/custom_ops.md), the readable definition that the
C++ library is tested against.

It shares no code with the library or the compiler. Coordinates are looked up through sorted int64
linear sites and ``np.searchsorted``, never through a dense grid of the spatial extent. Inputs are
assumed valid: the tests check the library's refusals separately.
"""

from __future__ import annotations

import itertools

import numpy as np

# ----------------------------------------------------------------------------------------------------
# Grids, linear sites and lookups


def volume(spatial_shape) -> int:
    return int(np.prod(spatial_shape, dtype=np.int64))


def strides_of(spatial_shape) -> np.ndarray:
    """Row-major strides: the last dimension varies fastest."""
    shape = [int(s) for s in spatial_shape]
    return np.array([int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape))], np.int64)


def linear_sites(coords: np.ndarray, spatial_shape) -> np.ndarray:
    """b·V + ((d0·S1 + d1)·S2 + d2) of each row (batch, d0, d1, d2)."""
    coords = np.asarray(coords, np.int64).reshape(-1, 1 + len(spatial_shape))
    return coords[:, 0] * volume(spatial_shape) + coords[:, 1:] @ strides_of(spatial_shape)


def decode_sites(sites: np.ndarray, spatial_shape) -> np.ndarray:
    """The rows (batch, d0, ...) of linear sites."""
    sites = np.asarray(sites, np.int64)
    coords = [sites // volume(spatial_shape)]
    rest = sites % volume(spatial_shape)
    for stride in strides_of(spatial_shape):
        coords.append(rest // stride)
        rest = rest % stride
    return np.stack(coords, axis=1).reshape(-1, 1 + len(spatial_shape))


class RowLookup:
    """Linear site -> row of a coordinate table, through sorted keys."""

    def __init__(self, sites: np.ndarray):
        self.order = np.argsort(sites, kind="stable")
        self.keys = sites[self.order]

    def __call__(self, query: np.ndarray) -> np.ndarray:
        if len(self.keys) == 0:
            return np.full(query.shape, -1, np.int64)
        at = np.minimum(np.searchsorted(self.keys, query), len(self.keys) - 1)
        return np.where(self.keys[at] == query, self.order[at], -1).astype(np.int64)


def kernel_taps(kernel_shape) -> np.ndarray:
    """[K, D]: the tap index of every tap, in row-major order of the kernel (the ONNX weight order)."""
    return np.array(list(itertools.product(*(range(k) for k in kernel_shape))), np.int64).reshape(-1, len(kernel_shape))


# ----------------------------------------------------------------------------------------------------
# Geometry: output extents and the input/output relation per tap


def strided_extent(spatial_shape, kernel_shape, strides, pads, dilations):
    D = len(spatial_shape)
    return [
        (spatial_shape[d] + pads[d] + pads[D + d] - dilations[d] * (kernel_shape[d] - 1) - 1) // strides[d] + 1
        for d in range(D)
    ]


def transposed_extent(spatial_shape, kernel_shape, strides, pads, dilations, output_padding):
    D = len(spatial_shape)
    return [
        strides[d] * (spatial_shape[d] - 1) + output_padding[d] + dilations[d] * (kernel_shape[d] - 1) + 1
        - pads[d] - pads[D + d]
        for d in range(D)
    ]


def inside(points: np.ndarray, extent) -> np.ndarray:
    return np.all((points >= 0) & (points < np.asarray(extent, np.int64)), axis=1)


def _neighbours(out_coords, coords, in_extent, taps, input_of, source):
    """nbr [M, K]: per tap, the input that output row m reads (input_of gives its point and validity)."""
    lookup = RowLookup(linear_sites(coords, in_extent))
    nbr = np.full((len(out_coords), len(taps)), -1, np.int64)
    for k, tap in enumerate(taps):
        points, valid = input_of(out_coords[:, 1:], tap)
        valid &= inside(points, in_extent)
        sites = out_coords[:, 0] * volume(in_extent) + points @ strides_of(in_extent)
        found = sites if source == "dense" else lookup(sites)
        nbr[:, k] = np.where(valid, found, -1)
    return nbr


def _reached(coords, out_extent, taps, output_of):
    """Sorted rows of every output-grid site some input reaches through some tap."""
    sites = []
    for tap in taps:
        points, valid = output_of(coords[:, 1:], tap)
        valid &= inside(points, out_extent)
        sites.append(coords[valid, 0] * volume(out_extent) + points[valid] @ strides_of(out_extent))
    return decode_sites(np.unique(np.concatenate(sites)), out_extent)


def _exact(numerator, strides):
    """numerator / strides where it divides exactly."""
    return numerator // strides, np.all(numerator % strides == 0, axis=1)


# ----------------------------------------------------------------------------------------------------
# Index builders


def _or(values, default) -> np.ndarray:
    return np.asarray(default if values is None else values, np.int64)


def submanifold_map(coords, kernel_shape, spatial_shape, dilations=None, source="rows"):
    coords = np.asarray(coords, np.int64)
    dilations = _or(dilations, [1] * len(kernel_shape))
    centre = (np.asarray(kernel_shape) - 1) // 2

    def input_of(points, tap):
        return points + (tap - centre) * dilations, np.ones(len(points), bool)

    return _neighbours(coords, coords, spatial_shape, kernel_taps(kernel_shape), input_of, source)


def _conv_rules(kernel_shape, strides, pads, dilations):
    """Strides, pads (begins and ends) and dilations, defaults filled in."""
    D = len(kernel_shape)
    return _or(strides, [1] * D), _or(pads, [0] * 2 * D), _or(dilations, [1] * D)


def strided_map(coords, kernel_shape, spatial_shape, strides=None, pads=None, dilations=None, source="rows"):
    """Convolution: i = o·s − pb + k·d."""
    coords = np.asarray(coords, np.int64)
    s, pads, d = _conv_rules(kernel_shape, strides, pads, dilations)
    p = pads[: len(kernel_shape)]
    out_extent = strided_extent(spatial_shape, kernel_shape, s, pads, d)
    taps = kernel_taps(kernel_shape)
    out_coords = _reached(coords, out_extent, taps, lambda i, k: _exact(i + p - k * d, s))
    nbr = _neighbours(out_coords, coords, spatial_shape, taps,
                      lambda o, k: (o * s - p + k * d, np.ones(len(o), bool)), source)
    return out_coords, nbr


def _transposed_rules(kernel_shape, spatial_shape, strides, pads, dilations, output_padding):
    s, pads, d = _conv_rules(kernel_shape, strides, pads, dilations)
    p = pads[: len(kernel_shape)]
    out_extent = transposed_extent(spatial_shape, kernel_shape, s, pads, d, _or(output_padding, [0] * len(s)))
    input_of = lambda o, k: _exact(o + p - k * d, s)  # noqa: E731
    output_of = lambda i, k: (i * s - p + k * d, np.ones(len(i), bool))  # noqa: E731
    return out_extent, input_of, output_of


def transposed_map(coords, kernel_shape, spatial_shape, strides=None, pads=None, dilations=None,
                   output_padding=None, source="rows"):
    """Transposed convolution: o = i·s − pb + k·d."""
    coords = np.asarray(coords, np.int64)
    out_extent, input_of, output_of = _transposed_rules(kernel_shape, spatial_shape, strides, pads, dilations,
                                                        output_padding)
    taps = kernel_taps(kernel_shape)
    out_coords = _reached(coords, out_extent, taps, output_of)
    return out_coords, _neighbours(out_coords, coords, spatial_shape, taps, input_of, source)


def target_map(coords, target_coords, kernel_shape, spatial_shape, strides=None, pads=None, dilations=None,
               output_padding=None, source="rows", transposed=1):
    """The table of given outputs: a transposed convolution's, or with transposed=0 a convolution's
    (`i = o·s − pb + k·d`)."""
    if transposed:
        _, input_of, _ = _transposed_rules(kernel_shape, spatial_shape, strides, pads, dilations, output_padding)
    else:
        s, pads, d = _conv_rules(kernel_shape, strides, pads, dilations)
        p = pads[: len(kernel_shape)]
        input_of = lambda o, k: (o * s - p + k * d, np.ones(len(o), bool))  # noqa: E731
    return _neighbours(np.asarray(target_coords, np.int64), np.asarray(coords, np.int64), spatial_shape,
                       kernel_taps(kernel_shape), input_of, source)


def rulebook(nbr, groups=1, skip_taps=()):
    """Per group of taps: (in_rows [Kg, Pg], out_rows [Kg, Pg], taps [Kg]). The taps with pairs, not
    skipped, sorted by pair count (largest first, ties by tap), cut into at most `groups` runs that
    minimise the padded pair count; each tap's pairs (nbr[m, k], m) in ascending m, padded with -1."""
    nbr = np.asarray(nbr, np.int64)
    counts = (nbr >= 0).sum(axis=0)
    order = sorted((k for k in range(nbr.shape[1]) if counts[k] > 0 and k not in skip_taps),
                   key=lambda k: (-counts[k], k))
    filled = min(groups, len(order))
    bounds = [*_group_starts([int(counts[k]) for k in order], filled), len(order)]
    result = []
    for g in range(groups):
        members = sorted(order[bounds[g]: bounds[g + 1]]) if g < filled else []
        width = max((int(counts[k]) for k in members), default=0)
        in_rows = np.full((len(members), width), -1, np.int64)
        out_rows = np.full((len(members), width), -1, np.int64)
        for a, k in enumerate(members):
            m = np.nonzero(nbr[:, k] >= 0)[0]
            in_rows[a, : len(m)] = nbr[m, k]
            out_rows[a, : len(m)] = m
        result.append((in_rows, out_rows, np.array(members, np.int64)))
    return result


def _group_starts(counts, groups):
    """Where each of `groups` runs of the descending `counts` starts: minimal Σ run length · first count,
    each prefix's last run starting as early as the minimum allows; equal runs beyond 1024 counts."""
    n = len(counts)
    if groups == n:
        return list(range(n))
    if n > 1024:
        return [g * n // groups for g in range(groups)]
    cost = [j * counts[0] for j in range(n + 1)]
    start = [[0] * (n + 1) for _ in range(groups)]
    for g in range(1, groups):
        best = [None] * (n + 1)
        for j in range(g + 1, n + 1):
            for i in range(g, j):
                if cost[i] is not None and (best[j] is None or cost[i] + (j - i) * counts[i] < best[j]):
                    best[j], start[g][j] = cost[i] + (j - i) * counts[i], i
        cost = best
    starts, end = [0] * groups, n
    for g in range(groups - 1, -1, -1):
        starts[g] = end = start[g][end]
    return starts


def site_index(coords, spatial_shape, batch_size):  # noqa: ARG001  (batch_size only bounds the batch)
    return linear_sites(coords, spatial_shape)


def site_order(coords, spatial_shape):
    """The rows by ascending linear site, the row each is, and each row's position in that order."""
    coords = np.asarray(coords, np.int64).reshape(-1, 1 + len(spatial_shape))
    order = np.argsort(linear_sites(coords, spatial_shape), kind="stable").astype(np.int64)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return coords[order], order.reshape(-1, 1), rank.reshape(-1, 1)


def active_sites(x):
    """coords of the sites of X [B, C, *S] where any channel is non-zero (NaN too), sorted; their sites."""
    x = np.asarray(x)
    B, C, *spatial = x.shape
    active = np.any(x.reshape(B, C, volume(spatial)) != 0, axis=1)  # [B, V]
    sites = np.flatnonzero(active).astype(np.int64)  # b·V + position, ascending
    return decode_sites(sites, spatial), sites.reshape(-1, 1)


# ----------------------------------------------------------------------------------------------------
# Data movement


def indexed_unfold(x, idx, spatial_shape=None):
    """Y[..., k·C + c] = X[idx[..., k], c] (rows) or channel c of site idx[..., k] (dense); 0 for -1."""
    x = np.asarray(x, np.float32)
    idx = np.asarray(idx, np.int64)
    if x.ndim == 2:
        rows = x
    else:
        B, C = x.shape[:2]
        rows = x.reshape(B, C, volume(x.shape[2:])).transpose(0, 2, 1).reshape(-1, C)  # [B·V, C], row = linear site
    C = x.shape[1]
    gathered = rows[np.maximum(idx, 0)] if len(rows) else np.zeros((*idx.shape, C), np.float32)
    gathered = np.where((idx >= 0)[..., None], gathered, np.float32(0))
    return gathered.reshape(*idx.shape[:-1], idx.shape[-1] * C)


def indexed_fold(rows, idx, mode="rows", like_rows=None, batch_size=None, spatial_shape=None, init=None):
    """Zeros (or init: [M, C], or [C] on every row), then rows[p] added at idx[p] in ascending p (-1 skipped)."""
    rows = np.asarray(rows, np.float32)
    idx = np.asarray(idx, np.int64).reshape(-1)
    C = rows.shape[-1]
    rows = rows.reshape(-1, C)
    keep = idx >= 0
    targets = like_rows if mode == "rows" else batch_size * volume(spatial_shape)
    y = np.zeros((targets, C), np.float32)
    if init is not None:
        y[:] = init
    np.add.at(y, idx[keep], rows[keep])  # unbuffered, in ascending p
    if mode == "rows":
        return y
    return y.reshape(batch_size, -1, C).transpose(0, 2, 1).reshape(batch_size, C, *spatial_shape)


def indexed_conv(x, idx, w, b=None, r=None, activation="none"):
    """Y [M, Cout] = act(b + Σ_k X[idx[:, k]] · W[k] + r), rows with idx -1 contributing nothing; in
    float64."""
    x, idx, w = np.asarray(x, np.float64), np.asarray(idx, np.int64), np.asarray(w, np.float64)
    y = np.zeros((idx.shape[0], w.shape[2])) + (0 if b is None else np.asarray(b, np.float64))
    for k in range(idx.shape[1]):
        read = idx[:, k] >= 0
        y[read] += x[idx[read, k]] @ w[k]
    y += 0 if r is None else np.asarray(r, np.float64)
    return (np.maximum(y, 0) if activation == "relu" else y).astype(np.float32)


def quantized_rows(x, x_scale):
    """u8 codes of X [N, Cin] per channel: X · (1 / x_scale) in float32, clamped to [0, 255] (NaN: 0),
    rounded to nearest even."""
    v = np.asarray(x, np.float32) * (np.float32(1) / np.asarray(x_scale, np.float32))
    v = np.minimum(np.where(v > 0, v, np.float32(0)), np.float32(255))
    return np.rint(v).astype(np.int64)


def indexed_conv_int8(x, idx, w, x_scale, w_scale, b=None, r=None, activation="none"):
    """Y [M, Cout] = act(b + Σ_k w_scale[k] · (q[idx[:, k]] · W[k]) + r) with q = quantized_rows(X): the
    tap sums exact (int64), each tap added to the float32 result in ascending k with one rounding."""
    q, idx, w = quantized_rows(x, x_scale), np.asarray(idx, np.int64), np.asarray(w, np.int64)
    w_scale = np.asarray(w_scale, np.float64)
    y = np.zeros((idx.shape[0], w.shape[2]), np.float32) + (0 if b is None else np.asarray(b, np.float32))
    for k in range(idx.shape[1]):
        read = idx[:, k] >= 0
        sums = q[idx[read, k]] @ w[k]
        y[read] = (sums * w_scale[k] + y[read].astype(np.float64)).astype(np.float32)
    y = y + (0 if r is None else np.asarray(r, np.float32))
    return np.maximum(y, 0) if activation == "relu" else y


# ----------------------------------------------------------------------------------------------------
# Index tables of the nna target


def _reads(nbr):
    """(m, k, i) of every entry nbr[m, k] = i >= 0."""
    nbr = np.asarray(nbr, np.int64)
    m, k = np.nonzero(nbr >= 0)
    return m, k, nbr[m, k]


def inverse_map(nbr, like_rows):
    """inv [K, N]: inv[k, i] = the output m with nbr[m, k] = i, -1 where none (each (i, k) read at most once)."""
    m, k, i = _reads(nbr)
    inv = np.full((np.shape(nbr)[1], like_rows), -1, np.int64)
    inv[k, i] = m
    return inv


def pair_lists(nbr, like_rows, capacities=None):
    """(sources, positions [K, M], offsets [K + 1]): per tap k, the block sources[offsets[k]:offsets[k + 1]]
    lists the input rows nbr[m, k] >= 0 in output order, then like_rows (the zero row) up to capacities[k]
    + 1 entries (its pair count + 1 without capacities); positions[k, m] is m's place in it, the count
    where nbr[m, k] = -1."""
    nbr = np.asarray(nbr, np.int64)
    blocks, positions = [], np.zeros(nbr.shape[::-1], np.int64)
    for k, column in enumerate(nbr.T):
        paired = column >= 0
        count = int(paired.sum())
        length = (count if capacities is None else capacities[k]) + 1
        blocks.append(np.concatenate([column[paired], np.full(length - count, like_rows, np.int64)]))
        positions[k] = np.where(paired, np.cumsum(paired) - 1, count)
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blocks])]).astype(np.int64)
    return np.concatenate([np.zeros(0, np.int64), *blocks]), positions, offsets


def scatter_matrices(nbr, like_rows):
    """S [K, M, N] float32: S[k, m, i] = 1 where nbr[m, k] = i, else 0."""
    M, K = np.shape(nbr)
    m, k, i = _reads(nbr)
    s = np.zeros((K, M, like_rows), np.float32)
    s[k, m, i] = 1.0
    return s


def capacity_pads(x, capacity):
    """pads [2·rank] of an ONNX Pad (every begin, then every end) growing axis 0 of x to capacity rows."""
    rank = np.ndim(x)
    pads = np.zeros(2 * rank, np.int64)
    pads[rank] = capacity - np.shape(x)[0]
    return pads
