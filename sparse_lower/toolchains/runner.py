"""A partition compiled for a toolchain, and run across runtimes: the host segments (index tables,
final fold) in onnxruntime, with the custom-op library where the manifest says a segment needs it (a
model lowered with `tables="standard"` has host segments that need none), the accelerator segments in
the toolchain's own runtime.

`compile_partition` writes everything a deployment needs into one folder (pre: a partition of a
lowered model whose accelerator segments have static shapes; post: the folder holds every segment as
ONNX, each accelerator segment's artifact, and manifest.json saying which file runs where), and
`CompiledPartition` runs that folder knowing only what is in it.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from ..errors import SparseLowerError
from ..frames.files import feeds_given
from ..partition import Partition
from ..runtime import create_session
from ..partition.devices import ACCELERATOR
from ..partition.value_types import describe_type
from ..quantization.calibration import segment_samples
from ..quantization.forms import QUANTIZED_PRECISION
from ..quantization.products import first_and_last_products, layer_products, weight_products
from .base import Run, Toolchain
from .prepare import prepare
from .registry import toolchain

def compile_partition(parts: Partition, name: str | Toolchain, directory: str | os.PathLike,
                      calibration: Iterable[Mapping[str, np.ndarray]] | None = None,
                      activation_bits: int = 8, wide_layers: Iterable[str] = (),
                      samples: Mapping[int, list[dict]] | None = None) -> "CompiledPartition":
    """Write `parts` into `directory` with its accelerator segments compiled by toolchain `name`
    ("onnxruntime", "openvino", "tvm", "rknn", "tflite", "qnn"); returns the compiled partition, ready to run.
    With `calibration` (graph feeds, e.g. real frames) the accelerator segments are quantized, in the
    form the toolchain names (`Toolchain.int8_form`), on what they read from those feeds: int8 weights,
    and int8 activations or, with
    `activation_bits=16`, int16 ones (precision "w8a16": on the CenterPoint backbone the 8-bit
    activations, not the weights, take its error above 2 %, docs/toolchains.md). `samples`: what each
    accelerator segment reads on those feeds, where the caller has it (`Plan.samples` of the
    mixed-precision search): the feeds are then not run again."""
    if activation_bits not in QUANTIZED_PRECISION:
        raise SparseLowerError(f"activation_bits={activation_bits}: activations quantize to 8 or 16 bits",
                               fix="pass activation_bits=8 (int8) or 16 (int8 weights, int16 activations)")
    if activation_bits != 8 and calibration is None:
        raise SparseLowerError(f"activation_bits={activation_bits} quantizes, and quantizing needs calibration frames",
                               fix="pass calibration=[feeds, ...]")
    if calibration is not None:
        calibration = feeds_given(parts.model, calibration, "calibration")
        if not calibration:
            raise SparseLowerError("calibration holds no frames", fix="pass calibration=[feeds, ...] with one or more "
                                   "frames, or leave it out for float segments")
    wide_layers = set(wide_layers)
    if wide_layers and calibration is None:
        raise SparseLowerError("wide_layers widens quantized layers, and quantizing needs calibration frames",
                               fix="pass calibration=[feeds, ...]")
    chain = toolchain(name) if isinstance(name, str) else name
    reason = chain.missing()
    if reason:
        raise SparseLowerError(reason)
    directory = Path(directory)
    manifest_path = parts.to_onnx(directory)
    manifest = json.loads(manifest_path.read_text())
    if calibration is not None and samples is None:
        samples = segment_samples(parts, calibration)
    keep_float = first_and_last_products(parts.graph) if calibration is not None else set()
    by_layer = {index: layer_products(weight_products(parts.segment_model(index))) for index in samples or {}}
    layers = {layer for products in by_layer.values() for layer in products}
    precisions: dict[str, str] = {}  # what each quantized layer became, as the form says
    if wide_layers - layers:
        raise SparseLowerError(f"wide_layers names {sorted(wide_layers - layers)}, which are no layers of the nna "
                               f"segments", fix=f"name some of {', '.join(sorted(layers))}")
    for entry in manifest["segments"]:
        if entry["device"] != ACCELERATOR:
            continue
        file = directory / entry["file"]
        segment = _accepted(parts.segment_model(entry["index"]), entry["index"], chain)
        if samples is not None:
            own = by_layer[entry["index"]]
            wide = {product for layer in wide_layers & set(own) for product in own[layer]}
            form = chain.int8_form()
            refusal = form.refuses(segment, activation_bits, wide)
            if refusal:
                raise SparseLowerError(refusal[0], fix=refusal[1])
            segment = form.quantized(segment, samples[entry["index"]], keep_float, activation_bits, wide)
            chain.precision = QUANTIZED_PRECISION[activation_bits]
            precisions.update({layer: form.layer_precision(bool(set(products) & keep_float), layer in wide_layers,
                                                           activation_bits) for layer, products in own.items()})
        prepared = chain.adapted(prepare(segment))
        onnx.save(prepared, file)  # the file the toolchain took
        declared = {value.name: describe_type(value.type) for value in prepared.graph.input}
        for value in entry["inputs"]:  # as the file takes them: index inputs narrowed to int32 (prepare.py)
            value["type"] = declared.get(value["name"], value["type"])
        artifact = file.with_suffix(chain.suffix)
        chain.build(prepared, artifact)
        entry["artifact"] = artifact.name
        entry["placement"] = [list(row) for row in chain.placement(artifact)]
    manifest["toolchain"] = {"name": chain.name, "version": chain.version(), "precision": chain.precision,
                             **({"wide_layers": sorted(wide_layers)} if wide_layers else {}),
                             **({"layers": dict(sorted(precisions.items()))} if precisions else {})}
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return CompiledPartition(directory, chain)


def _accepted(segment: onnx.ModelProto, index: int, chain: Toolchain) -> onnx.ModelProto:
    """The segment, once checked to have static shapes and a form the toolchain takes."""
    for value in segment.graph.input:
        if any(d.dim_param or not d.HasField("dim_value") for d in value.type.tensor_type.shape.dim):
            raise SparseLowerError(f"accelerator segment {index} has the dynamic input '{value.name}'",
                                   fix="lower with max_active so that the accelerator segments have static shapes")
    refusal = chain.refuses(segment)
    if refusal:
        raise SparseLowerError(f"accelerator segment {index}: {refusal[0]}", fix=refusal[1])
    return segment


class CompiledPartition:
    """The folder `compile_partition` wrote, run segment by segment (sessions and toolchain runtimes
    are made on the first run and kept)."""

    def __init__(self, directory: str | os.PathLike, chain: Toolchain | None = None):
        self.directory = Path(directory)
        self.manifest = json.loads((self.directory / "manifest.json").read_text())
        if "toolchain" not in self.manifest:
            raise SparseLowerError(f"{self.directory} holds no compiled partition (its manifest names no toolchain)",
                                   fix="write it with compile_partition or `sparse-lower partition --for TOOLCHAIN`")
        self.toolchain = chain or toolchain(self.manifest["toolchain"]["name"])
        self.toolchain.precision = self.manifest["toolchain"]["precision"]
        self._runs: dict[int, Run] = {}

    @property
    def precision_said(self) -> str:
        """The precision as it is, layer by layer where the segments were quantized: "w8a8 on 1 of 3
        layers, float on 2", "w16a16 on 3 of 3 layers"; else the toolchain's ("fp32")."""
        layers = self.manifest["toolchain"].get("layers")
        if not layers:
            return self.toolchain.precision
        counts = Counter(layers.values()).most_common()
        (first, n), rest = counts[0], counts[1:]
        return ", ".join([f"{first} on {n} of {len(layers)} layers", *(f"{kind} on {m}" for kind, m in rest)])

    @property
    def fallbacks(self) -> list[tuple[int, str, str, str]]:
        """(segment, op, unit, name) for every op the toolchain placed off its accelerator (rknn: on
        its CPU), as its build log names them."""
        return [(entry["index"], op, unit, name) for entry in self.manifest["segments"]
                for op, unit, name in entry.get("placement", []) if unit == "CPU"]

    def _run(self, entry: dict) -> Run:
        index = entry["index"]
        if index not in self._runs:
            if "artifact" in entry:
                self._runs[index] = self.toolchain.load(self.directory / entry["artifact"],
                                                        onnx.load(self.directory / entry["file"]))
            else:
                file = str(self.directory / entry["file"])  # manifests written before needs_library: all do
                session = create_session(file) if entry.get("needs_library", True) else \
                    ort.InferenceSession(file, providers=["CPUExecutionProvider"])
                names = [o["name"] for o in entry["outputs"]]
                self._runs[index] = lambda inputs, s=session, n=names: dict(zip(n, s.run(n, dict(inputs))))
        return self._runs[index]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph outputs by name, as the unpartitioned model returns them."""
        expected = [value["name"] for value in self.manifest["inputs"]]
        if sorted(feeds) != sorted(expected):
            raise SparseLowerError(f"feeds {sorted(feeds)} do not match the graph inputs",
                                   fix=f"feed exactly {expected}")
        values = dict(feeds)
        for entry in self.manifest["segments"]:
            outputs = self._run(entry)({value["name"]: values[value["name"]] for value in entry["inputs"]})
            values.update(outputs)
        missing = [value["name"] for value in self.manifest["outputs"] if value["name"] not in values]
        if missing:
            raise SparseLowerError(f"graph outputs {missing} come from no segment (initializers)",
                                   fix="read them from the model")
        return {value["name"]: values[value["name"]] for value in self.manifest["outputs"]}
