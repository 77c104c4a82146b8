"""Rockchip rknn-toolkit2: the segment built for the RK3588 NPU (fp16) and run in the toolkit's x86
simulator.

The simulator runs only a model built in the same process (it does not load `.rknn` files), so
`load` builds again from the prepared ONNX segment that sits next to the artifact; the `.rknn` file is
what a board runs. The build log's layer table says where each op runs (NPU or CPU): `placement`
reads it back, so callers can check that no compute fell back to the CPU. Measured (docs/toolchains.md):
only the `matmul` combine keeps every op on the NPU; `Gather` and `ScatterElements` always run on the
CPU, in any integer width and either layout, and so do `GatherElements` and `ScatterND`.

int8: rknn calibrates by itself (`do_quantization`). Where layers are to stay wider than 8 bits (the
network's first and last, which stay float in every int8 form, and the mixed-precision plan's wide
ones) it quantizes in two steps instead (`hybrid_quantization_step1`, the written config's
`custom_quantize_layers` given those layers' tensors in float16,
`hybrid_quantization_step2`): the RK3588 takes no 16-bit activations, float16 is its wider type. A
layer's tensors are what `htp.layer_tensors` gives it (what its products read, back to the previous
layer's activation through the gathers and the zero row's pad, and what they write, forward through the
bias, the residual sum and the activation), found in rknn's rewritten model by the names rknn derives
from ours (`derived_tensors`). Listing only the ops named after a layer left the tensors between
layers int8, and the CenterPoint backbone 63.6 % off with every layer listed (docs/toolchains.md, rknn
outside calibration).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..errors import SparseLowerError
from ..quantization.forms import CalibratedByToolchain
from ..quantization.htp import layer_tensors
from ..quantization.products import layer_of
from .base import Run, Toolchain
from .prepare import fed
from .quiet import output_to

TARGET = "rk3588"
_LAYER = re.compile(r"^D RKNN: \[[0-9:.]*\] +\d+ +(\w+) +(?:FLOAT16|FLOAT|INT8|UINT8|INT16|INT32|INT64|BOOL) +(\w+) "
                    r".* \w+:(\S+)\s*$")  # op, unit, ..., OpType:name


class Rknn(Toolchain):
    name = "rknn"
    title = "rknn-toolkit2 (RK3588 simulator)"
    modules = ("rknn",)
    distribution = "rknn-toolkit2"
    suffix = ".rknn"
    precision = "fp16"

    def __init__(self):
        self.dataset: list[dict[str, np.ndarray]] | None = None  # int8 calibration inputs; None: fp16
        self.float16_products: set[str] = set()  # the products whose layers int8 keeps in float16 (hybrid)

    def int8_form(self) -> CalibratedByToolchain:
        """rknn quantizes by itself at build time (its own calibration on the samples), the first and last
        layers and the wide ones in float16 (module docstring); for the RK3588 only 8-bit activations."""
        return CalibratedByToolchain(
            self._keep_dataset, f"rknn-toolkit2 quantizes {TARGET} segments with 8-bit activations only (its message: "
                                f"The quantized_dtype = 'w8a16' not support in '{TARGET}')",
            "quantize for rknn with 8-bit activations (its wide layers in float16), or run 16-bit activations with "
            "onnxruntime, OpenVINO or TVM")

    def _keep_dataset(self, samples: list[dict], wider: set[str]) -> None:
        self.dataset, self.float16_products = samples, set(wider)

    def _built(self, onnx_path: Path, model: onnx.ModelProto, log: Path):
        from rknn.api import RKNN

        toolkit = RKNN(verbose=True)
        with output_to(log):
            toolkit.config(target_platform=TARGET)
            status = toolkit.load_onnx(model=str(onnx_path))
            if status == 0 and self.dataset is not None and self.float16_products:
                toolkit, status = self._hybrid(toolkit, onnx_path, model)
            elif status == 0:
                status = toolkit.build(do_quantization=self.dataset is not None,
                                       dataset=self._dataset_file(onnx_path, model))
        if status != 0:
            raise SparseLowerError(f"rknn-toolkit2 could not build {onnx_path.name} (status {status})",
                                   fix=f"read its log {log}")
        return toolkit

    def _hybrid(self, toolkit, onnx_path: Path, model: onnx.ModelProto):
        """(toolkit, status): the loaded model quantized in rknn's two hybrid steps, the tensors of the
        layers of `float16_products` in float16. Step 1 writes `{stem}.model` (the model as rknn rewrote it,
        ONNX, its names derived from ours), `.data` and `.quantization.cfg` (whose `custom_quantize_layers`
        names the tensors to keep in float16) into the working folder."""
        from rknn.api import RKNN

        with _working_in(onnx_path.parent):
            status = toolkit.hybrid_quantization_step1(dataset=self._dataset_file(onnx_path, model))
            if status != 0:
                return toolkit, status
            stem = onnx_path.stem
            layers = {layer_of(product) for product in self.float16_products}
            kept = layer_tensors(model, self.float16_products) | {
                output for node in model.graph.node if layer_of(node.name) in layers for output in node.output}
            written = derived_tensors(onnx.load(f"{stem}.model"), model, kept)
            config = Path(f"{stem}.quantization.cfg")
            lines = config.read_text().splitlines()
            if lines[0] != "custom_quantize_layers: {}":
                raise SparseLowerError(f"rknn-toolkit2 wrote {config} in a form this version does not know "
                                       f"(first line {lines[0]!r})", fix="use rknn-toolkit2 2.5.0")
            listed = [f"    {json.dumps(name)}: float16" for name in written]
            config.write_text("\n".join(["custom_quantize_layers:", *listed, *lines[1:]]) + "\n")
            toolkit.release()
            toolkit = RKNN(verbose=True)
            toolkit.config(target_platform=TARGET)
            return toolkit, toolkit.hybrid_quantization_step2(
                model_input=f"{stem}.model", data_input=f"{stem}.data", model_quantization_cfg=str(config))

    def _dataset_file(self, onnx_path: Path, model: onnx.ModelProto) -> str | None:
        """The calibration list rknn reads: one line per sample, one .npy per input in input order."""
        if self.dataset is None:
            return None
        lines = []
        for i, sample in enumerate(self.dataset):
            arrays = fed(model, sample)
            files = []
            for j, value in enumerate(model.graph.input):
                path = onnx_path.with_name(f"{onnx_path.stem}.calibration{i}_{j}.npy")
                np.save(path, arrays[value.name])
                files.append(path.name)
            lines.append(" ".join(files))
        listing = onnx_path.with_name(f"{onnx_path.stem}.calibration.txt")
        listing.write_text("\n".join(lines) + "\n")
        return str(listing)

    def adapted(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """Every group of `Gather`s of one tensor along one axis made one `Gather` of their indices, side
        by side, and a `Slice` per former gather: rknn-toolkit2 computes every `Gather` of a tensor after
        the first as if it were the first (the same rows whatever its indices; of another length, a shape
        error), measured on 2.5 with the pairs combine's per-tap gathers of the input rows."""
        graph = gs.import_onnx(model)
        groups: dict[tuple[str, int], list[gs.Node]] = {}
        for node in graph.nodes:
            if node.op == "Gather" and node.inputs[1].shape and len(node.inputs[1].shape) == 1:
                groups.setdefault((node.inputs[0].name, node.attrs.get("axis", 0)), []).append(node)
        for (_, axis), nodes in groups.items():
            if len(nodes) < 2 or not all(isinstance(n.inputs[1].shape[0], int) for n in nodes):
                continue
            lengths = [n.inputs[1].shape[0] for n in nodes]
            base = nodes[0].name or nodes[0].outputs[0].name
            indices = gs.Variable(f"{base}/indices", dtype=nodes[0].inputs[1].dtype, shape=[sum(lengths)])
            graph.nodes.append(gs.Node("Concat", f"{base}/Concat", {"axis": 0}, [n.inputs[1] for n in nodes], [indices]))
            data = nodes[0].inputs[0]
            gathered = gs.Variable(f"{base}/gathered", dtype=data.dtype)
            graph.nodes.append(gs.Node("Gather", f"{base}/Gather", {"axis": axis}, [data, indices], [gathered]))
            ends = np.cumsum(lengths)
            for i, (node, start, end) in enumerate(zip(nodes, ends - lengths, ends)):
                bounds = [gs.Constant(f"{base}/slice{i}/{what}", np.array([value], np.int64))
                          for what, value in (("start", start), ("end", end), ("axis", axis))]
                graph.nodes.append(gs.Node("Slice", f"{base}/slice{i}", inputs=[gathered, *bounds],
                                           outputs=list(node.outputs)))
                node.outputs.clear()
        graph.cleanup().toposort()
        adapted = gs.export_onnx(graph, do_type_check=False)
        adapted.ir_version = model.ir_version  # onnx-graphsurgeon stamps its own
        del adapted.opset_import[:]
        adapted.opset_import.extend(model.opset_import)
        return adapted

    def build(self, model: onnx.ModelProto, path: Path) -> None:
        onnx_path = path.with_suffix(".onnx")
        log = path.with_suffix(".log")
        log.unlink(missing_ok=True)
        toolkit = self._built(onnx_path, model, log)
        with output_to(log):
            toolkit.export_rknn(str(path))
        toolkit.release()
        # rknn reshapes each 2-D input into its 4-D input layout on the CPU, and so the segment's own Reshape
        # of an input (the rows layout's [N] row mask to [N, 1]): a copy, not compute
        inputs = {value.name for value in model.graph.input}
        inputs |= {node.output[0] for node in model.graph.node if node.op_type == "Reshape" and node.input[0] in inputs}
        layers = [match.groups() for match in map(_LAYER.match, log.read_text(errors="replace").splitlines()) if match]
        layers = [(op, "input" if op == "Reshape" and name.removesuffix("_rs") in inputs else unit, name)
                  for op, unit, name in layers]
        path.with_suffix(".placement.json").write_text(json.dumps(layers) + "\n")

    def placement(self, path: Path) -> list[tuple[str, str, str]]:
        return [tuple(row) for row in json.loads(path.with_suffix(".placement.json").read_text())
                if row[0] not in ("InputOperator", "OutputOperator")]

    def load(self, path: Path, model: onnx.ModelProto) -> Run:
        log = path.with_suffix(".log")
        toolkit = self._built(path.with_suffix(".onnx"), model, log)
        with output_to(log):
            if toolkit.init_runtime() != 0:
                raise SparseLowerError("rknn-toolkit2's simulator did not start", fix=f"read its log {log}")
        order = [value.name for value in model.graph.input]
        names = [value.name for value in model.graph.output]
        shapes = {value.name: [d.dim_value for d in value.type.tensor_type.shape.dim] for value in model.graph.output}

        def run(inputs):
            arrays = fed(model, inputs)
            with output_to(log):
                results = toolkit.inference(inputs=[arrays[name] for name in order])
            return {name: np.asarray(value, np.float32).reshape(shapes[name]) for name, value in zip(names, results)}

        return run


def derived_tensors(rewritten: onnx.ModelProto, model: onnx.ModelProto, tensors: set[str]) -> list[str]:
    """The tensors of rknn's `rewritten` model that stand for `tensors` of ours, in its order. rknn names
    what it makes after what it came from: a tensor after ours with a suffix (`…/partial_mm`, `…_tp`,
    `…_int8`), an op after our op (`…/MatMul#2`) or after our tensor (`…/padded_rs`). A rewritten tensor
    stands for ours where its own name, or its op's, is ours or begins with ours and one of `_-#`; the
    longest such name decides, and a name of our op stands for what that op writes."""
    origins = {node.name: set(node.output) for node in model.graph.node if node.name}
    origins.update({name: {name} for node in model.graph.node for name in node.output})
    origins.update({value.name: {value.name} for value in model.graph.input})

    def origin(name: str) -> set[str]:
        for cut in [len(name), *(i for i in range(len(name) - 1, 0, -1) if name[i] in "_-#")]:
            if name[:cut] in origins:
                return origins[name[:cut]]
        return set()

    return [output for node in rewritten.graph.node for output in node.output
            if (origin(output) | origin(node.name)) & tensors]


@contextlib.contextmanager
def _working_in(folder: Path):
    """The working folder moved to `folder` for a while: rknn's hybrid steps write their files there
    (contextlib.chdir is Python 3.11's)."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)
