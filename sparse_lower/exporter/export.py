"""`sparse_lower.export`: a PyTorch module with spconv or MinkowskiEngine layers traced to source ops
(exporter/trace.py), then checked: the model, lowered for the gpu target, runs on the example in
onnxruntime and must give what the module returned, sparse outputs compared by site.

The check is what keeps a module that reads rows by their position from being exported with silently
wrong numbers: the source ops order a strided layer's rows by site, spconv in its own order, so such a
module computes other numbers once exported. A tensor output with as many rows as a sparse output may be
that output's rows (a detection head's, on the sparse tensor it ran on): it matches in either order. The
check costs one lowering and one run of the example.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

from ..api import lower, positive_int
from ..errors import SparseLowerError
from ..importers import nothing_to_lower
from .trace import trace
from ..runtime import RUNTIME_ERRORS, runtime_refusal, session_for
from ..verify import non_finite, relative_error

CHECK_TOLERANCE = 1e-3  # of each output's largest value; the exports measured stay below 1e-5


def export(module, example, path: str | os.PathLike | None = None, *, max_spatial_shape=None,
           check: bool = True) -> onnx.ModelProto:
    """The source-op ONNX model of `module` traced on `example` (an spconv `SparseConvTensor`, a MinkowskiEngine
    `SparseTensor`, or the tuple
    of the module's positional arguments), checked against the module on it unless `check=False`, and
    saved to `path` when given. `max_spatial_shape`: the largest grid a frame may have, where the module
    computes its grid from the frame or runs on an engine that has none (default: 2^(48 / D) per axis,
    2^16 in 3-D, exporter.traced_calls.default_bound). docs/formats.md#sparse_lowerexport."""
    if path is not None and Path(path).is_dir():
        raise SparseLowerError(f"path {path} is a folder, where the model file goes",
                               fix=f"give a file name, e.g. {Path(path) / 'model.onnx'}")
    if path is not None and not Path(path).absolute().parent.is_dir():
        raise SparseLowerError(f"path {path}: the folder {Path(path).absolute().parent} does not exist",
                               fix="make the folder first, or give a path in an existing one")
    if max_spatial_shape is not None:
        max_spatial_shape = _bound(max_spatial_shape)
    traced = trace(module, example, max_spatial_shape)
    said = non_finite(traced.feeds)
    if check and said:
        raise SparseLowerError(f"the example's {said}: the check cannot compare the model with the module on it",
                               fix="export on a frame of finite values, or pass check=False")
    if check:
        _check(traced)
    if path is not None:
        onnx.save(traced.model, os.fspath(path))
    return traced.model


def _bound(max_spatial_shape) -> list[int]:
    """max_spatial_shape checked: a sequence of extents, each an int >= 1."""
    extents = None if isinstance(max_spatial_shape, (str, bytes)) else np.asarray(max_spatial_shape, dtype=object)
    if extents is None or extents.ndim != 1 or not len(extents) or not all(map(positive_int, extents)):
        raise SparseLowerError(f"max_spatial_shape {max_spatial_shape!r} is not a list of extents >= 1",
                               fix="give one int >= 1 per spatial dimension, e.g. [41, 1440, 1440]")
    return [int(e) for e in extents]


def _site_order(coords: np.ndarray) -> np.ndarray:
    return np.lexsort(np.asarray(coords, np.int64).T[::-1])


def _check(traced) -> None:
    model = traced.model if nothing_to_lower(traced.model) else lower(traced.model, target="gpu")
    session = session_for(model)
    names = [o.name for o in session.get_outputs()]
    try:
        got = dict(zip(names, session.run(names, traced.feeds)))
    except RUNTIME_ERRORS as error:  # the example breaks a rule of sparse tensors (off its grid, a site twice)
        refusal = runtime_refusal(error)
        said = refusal if isinstance(refusal, SparseLowerError) else SparseLowerError(refusal)
        raise SparseLowerError(f"the exported model refuses the example: {said.reason}", node=said.node,
                               fix="give an example whose coordinates lie inside the module's grid, each site "
                                   "once") from error
    sparse = {name[:-len("features")]: name for name in traced.outputs
              if name.endswith("_features") and f"{name[:-len('features')]}coords" in traced.outputs}
    for prefix in sparse:
        have, want = got[f"{prefix}coords"], traced.outputs[f"{prefix}coords"].astype(np.int64)
        if have.shape != want.shape or not np.array_equal(np.unique(have, axis=0), np.unique(want, axis=0)):
            raise SparseLowerError(f"the exported model's output '{prefix}coords' has other sites than the module's "
                                   f"on the example ({len(have)} rows against {len(want)})",
                                   fix="report it: the source ops should reach the sites spconv reaches")
    # each output compared as it is, and tensors of a sparse output's row count also by that output's sites
    # (a head's rows are the rows of the sparse tensor it ran on)
    orders = [(_site_order(got[f"{prefix}coords"]), _site_order(traced.outputs[f"{prefix}coords"]))
              for prefix in sparse]
    for name, want in traced.outputs.items():
        if any(name == f"{prefix}coords" for prefix in sparse):
            continue
        have, want = np.asarray(got[name]), np.asarray(want)
        candidates = [(have, want)] + [(have[ours], want[theirs]) for ours, theirs in orders
                                       if have.ndim and len(ours) == len(have) == len(want)]
        errors = [relative_error(a, b) for a, b in candidates]
        if name[:-len("features")] in sparse:
            errors = errors[1:]  # a sparse output's features: by its own sites only
        if not min(errors, default=float("inf")) <= CHECK_TOLERANCE:
            raise SparseLowerError(
                f"the exported model's output '{name}' differs from the module's on the example (largest error "
                f"{min(errors):.2e} of its largest value)",
                fix="the model orders a strided layer's rows by site, spconv in its own order: read rows by their "
                    "coordinates rather than by position, and return the SparseConvTensor the rows belong to beside "
                    "them; export(check=False) skips this check")
