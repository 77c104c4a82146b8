"""Importers: the sparse-convolution ONNX found in the wild → source ops (docs/formats.md).

    model = sparse_lower.import_model("scn.onnx")      # NVIDIA, AIMET, Autoware, or already source ops
    lowered = sparse_lower.lower(model, target="gpu")

What an imported model looks like:

* source ops (`sparse::SubmanifoldConv`, `SparseConv`, `SparseDeconv`, `ToDense`) plus standard
  ONNX ops, float32 throughout (FP16 weights are widened), default opset >= 17, IR version 10; it
  passes `onnx.checker`;
* the feature input keeps its name (now float32). NVIDIA graphs carry no coordinates: an int64 input
  `coords [N, 1 + D]` is added (batch first, then the spatial axes in the order ScatterDense's
  `format` names). AIMET's `indices` input keeps its name and becomes int64 (cast int32 indices before
  feeding them); Autoware's coordinate input and the standard ops that read it stay;
* every output the source declares keeps its name and shape; a sparse output (features) is joined by
  an int64 output `<name>_coords` holding the coordinates of its rows (SparseConv orders its rows
  lexicographically, which the source's engine need not do, so rows are only meaningful with them);
* the fused `activation` of a conv is a Relu / LeakyRelu (alpha 0.01, torch's default) / Sigmoid node;
  `ScatterDense` is `ToDense` (+ Transpose for format "xyz", + Reshape where `output_shape` folds axes);
* the metadata `sparse_lower.import` reports the format, the inputs widened from float16, the layout
  of every coordinates input, the notes (also issued as SparseLowerWarning) and any INT8 ranges.

An importer never lowers: the result is the input of `sparse_lower.lower`. Every refusal is a
SparseLowerError naming the source node and the fix.

This package reads ONNX files that other tools wrote. For users who have the PyTorch module rather than
a file, `sparse_lower.export` (the exporter/ package) traces it and writes the same source-op form; it
needs torch and the module's engine, imported only when it runs.
"""

from __future__ import annotations

import math
import os
from collections import Counter

import onnx

from ..errors import SparseLowerError
from ..model_io import load
from ..onnx_conventions import SOURCE_DOMAIN
from ..schemas import SOURCE_OPS
from .aimet import AimetFormat
from .autoware import AutowareFormat
from .nvidia import NvidiaFormat
from ..float16 import to_float32
from ..structure import check_structure

FORMATS = (NvidiaFormat(), AimetFormat(), AutowareFormat())
SOURCE_FORMAT = "source"  # detect_format's answer for a model that needs no import


def detect_format(model: onnx.ModelProto | str | os.PathLike) -> str:
    """"nvidia", "aimet", "autoware", or "source" for anything else (source ops or plain ONNX: nothing to
    import)."""
    model = load(model)
    found = [fmt for fmt in FORMATS if any(fmt.is_conv(node) for node in model.graph.node)]
    if len(found) > 1:
        raise SparseLowerError(f"the model mixes the {' and '.join(f.title for f in found)} formats",
                               fix="export the network in one format")
    if found and any(node.domain == SOURCE_DOMAIN for node in model.graph.node):
        raise SparseLowerError(f"the model mixes {found[0].title} nodes with source-op '{SOURCE_DOMAIN}' nodes",
                               fix="export the network in one format")
    return found[0].key if found else SOURCE_FORMAT


def format_title(key: str) -> str:
    """The human-readable name of a format `detect_format` returned."""
    return next((fmt.title for fmt in FORMATS if fmt.key == key), "source ops / standard ONNX")


def import_model(model: onnx.ModelProto | str | os.PathLike, leaky_relu_alpha: float | None = None) -> onnx.ModelProto:
    """The source-op form of a foreign sparse-convolution model; a source-op model is returned unchanged.

    `leaky_relu_alpha`: the slope of the network's LeakyReLU activations where the file does not record
    it (NVIDIA's exporters drop it); None reads torch's default, 0.01, and notes it."""
    model = load(model)
    key = detect_format(model)
    if key == SOURCE_FORMAT:
        return model
    if leaky_relu_alpha is not None and not (isinstance(leaky_relu_alpha, (int, float)) and
                                             math.isfinite(leaky_relu_alpha)):
        raise SparseLowerError(f"leaky_relu_alpha={leaky_relu_alpha!r} is not a finite number",
                               fix="give the slope the network's LeakyReLU uses, e.g. 0.1")
    check_structure(model)
    fmt = next(fmt for fmt in FORMATS if fmt.key == key)
    return fmt.translate(*to_float32(model), leaky_relu_alpha)


def nothing_to_lower(model: onnx.ModelProto) -> str | None:
    """Why `model` (source ops or standard ONNX) gives the lowering nothing to do, or None when it has
    source ops. A model whose sparse layers are in a form no importer knows (another domain, another
    exporter) or a dense CNN would otherwise pass through unchanged: the message says what was found
    and which forms are recognised."""
    nodes = model.graph.node
    if any(node.domain == SOURCE_DOMAIN for node in nodes):
        return None
    foreign = Counter(f"{node.domain}::{node.op_type}" for node in nodes if node.domain not in ("", SOURCE_DOMAIN))
    found = (f"ops outside the standard domain: {', '.join(f'{op} ×{n}' for op, n in sorted(foreign.items()))}"
             if foreign else "only standard ONNX ops (a dense model, which onnxruntime runs as it is)")
    ops = Counter(node.op_type for node in nodes)
    summary = ", ".join(f"{op} ×{n}" for op, n in ops.most_common(6)) or "no nodes"
    recognised = "; ".join([f"the source ops ({SOURCE_DOMAIN}::{', '.join(SOURCE_OPS)})",
                            *(f"{fmt.title} ({fmt.signature})" for fmt in FORMATS)])
    return (f"nothing to lower: no sparse convolution in a form sparse_lower recognises. The model has "
            f"{len(nodes)} nodes ({summary}); {found}. Recognised: {recognised}. docs/formats.md describes "
            f"each form")


__all__ = ["FORMATS", "SOURCE_FORMAT", "detect_format", "format_title", "import_model", "nothing_to_lower"]
