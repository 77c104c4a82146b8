"""spconv's semantics in plain NumPy loops over a dict of active sites ({(batch, *site): feature
vector}): the evaluation the importers' tests compare against, sharing nothing with the importers or
with the source-op reference."""

from __future__ import annotations

import itertools

import numpy as np

LEAKY_SLOPE = 0.01
ACTIVATIONS = {"None": lambda v: v, "ReLU": lambda v: np.maximum(v, 0),
               "Sigmoid": lambda v: 1 / (1 + np.exp(-v)), "LeakyReLU": lambda v: np.where(v > 0, v, LEAKY_SLOPE * v)}


def _taps(kernel):
    return list(itertools.product(*(range(k) for k in kernel)))


def spconv_subm(x, w, b, dilation):
    centre = [(k - 1) // 2 for k in w.shape[1:-1]]
    out = {}
    for site in x:
        value = b.copy()
        for tap in _taps(w.shape[1:-1]):
            source = (site[0], *(c + (t - m) * d for c, t, m, d in zip(site[1:], tap, centre, dilation)))
            if source in x:
                value += w[(slice(None), *tap, slice(None))] @ x[source]
        out[site] = value
    return out


def spconv_conv(x, w, b, stride, padding, dilation, out_shape):
    """spconv's forward rule: input i reaches output o through tap k when i = o·s − p + k·d."""
    out = {}
    for site, feature in x.items():
        for tap in _taps(w.shape[1:-1]):
            numerator = [c + p - t * d for c, p, t, d in zip(site[1:], padding, tap, dilation)]
            if any(n % s for n, s in zip(numerator, stride)):
                continue
            o = [n // s for n, s in zip(numerator, stride)]
            if all(0 <= v < e for v, e in zip(o, out_shape)):
                key = (site[0], *o)
                out[key] = out.get(key, b) + w[(slice(None), *tap, slice(None))] @ feature
    return out


def spconv_deconv(x, w, b, stride, padding, out_shape):
    """SparseConvTranspose: input i sends tap k to o = i·s − p + k (spconv ignores dilation here)."""
    out = {}
    for site, feature in x.items():
        for tap in _taps(w.shape[1:-1]):
            o = [c * s - p + t for c, s, p, t in zip(site[1:], stride, padding, tap)]
            if all(0 <= v < e for v, e in zip(o, out_shape)):
                key = (site[0], *o)
                out[key] = out.get(key, b) + w[(slice(None), *tap, slice(None))] @ feature
    return out


def spconv_inverse(x, w, b, forward_sites, stride, padding, dilation):
    """SparseInverseConv: the forward conv's pairs (input j, output o, tap k) read backwards."""
    out = {}
    for site in forward_sites:
        value = b.copy()
        for tap in _taps(w.shape[1:-1]):
            numerator = [c + p - t * d for c, p, t, d in zip(site[1:], padding, tap, dilation)]
            if any(n % s for n, s in zip(numerator, stride)):
                continue
            source = (site[0], *(n // s for n, s in zip(numerator, stride)))
            if source in x:
                value += w[(slice(None), *tap, slice(None))] @ x[source]
        out[site] = value
    return out


def spconv_dense(x, batch, channels, grid):
    """spconv's `.dense()`: [B, C, *grid], the spatial axes in the coordinates' order."""
    dense = np.zeros((batch, channels, *grid), np.float32)
    for site, feature in x.items():
        dense[(site[0], slice(None), *site[1:])] = feature
    return dense


def as_dict(features, coords):
    return {tuple(int(v) for v in row): feature for row, feature in zip(coords, features)}
