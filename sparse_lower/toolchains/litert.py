"""LiteRT (TensorFlow Lite) through onnx2tf: the segment converted to a float32 `.tflite` and run by
LiteRT's interpreter (XNNPACK on the CPU).

onnx2tf re-lays 4-D tensors out as NHWC and mistranslates a gather on the last axis of the
`[1, C, 1, N]` image, and it refuses `ScatterElements` with `reduction="add"` (docs/toolchains.md):
lower with `layout="rows"` and the gather or matmul combine for it.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx

from ..errors import SparseLowerError
from ..quantization.forms import Unsupported
from .base import Run, Toolchain
from .prepare import fed
from .quiet import output_to


class LiteRt(Toolchain):
    name = "tflite"
    title = "LiteRT via onnx2tf"
    modules = ("onnx2tf", "ai_edge_litert")
    distribution = "onnx2tf"
    suffix = ".tflite"
    image_layout_wrong = ("onnx2tf mistranslates the nna image layout (4-D '{image}': a gather on its last axis "
                          "fails to convert, the matmul combine converts to wrong numbers)")

    def int8_form(self) -> Unsupported:
        """Refused: onnx2tf converts onnxruntime's QDQ segments to wrong numbers (32 % error on one SubM
        layer, measured), and its own int8 path (calibrated TFLite conversion) is not wired up here."""
        return Unsupported("int8 for LiteRT is not supported: onnx2tf converts the QDQ segments to wrong numbers",
                           "run int8 with onnxruntime, OpenVINO, TVM or rknn; LiteRT in float32")

    def build(self, model: onnx.ModelProto, path: Path) -> None:
        import onnx2tf

        log = path.with_suffix(".log")
        log.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory() as work:
            source = Path(work) / "segment.onnx"  # onnx2tf names its output after the input file
            shutil.copy(path.with_suffix(".onnx"), source)
            try:
                with output_to(log):
                    onnx2tf.convert(input_onnx_file_path=str(source), output_folder_path=str(Path(work) / "out"),
                                    non_verbose=True,
                                    keep_shape_absolutely_input_names=[value.name for value in model.graph.input])
            except (Exception, SystemExit) as error:  # onnx2tf exits on an op it refuses
                text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))  # its colours
                lines = [line for line in text.splitlines() if "ERROR" in line and "trace log" not in line]
                raise SparseLowerError(f"onnx2tf could not convert {path.stem}: "
                                       f"{' '.join(lines[:2]) or type(error).__name__}",
                                       fix=f"lower with layout='rows' and combine 'gather' or 'matmul'; "
                                           f"log: {log}") from None
            shutil.copy(Path(work) / "out" / "segment_float32.tflite", path)

    def load(self, path: Path, model: onnx.ModelProto) -> Run:
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=str(path))
        runner = interpreter.get_signature_runner()
        wanted = runner.get_input_details()
        names = [value.name for value in model.graph.output]

        def run(inputs):
            arrays = fed(model, inputs)
            results = runner(**{name: arrays[name].astype(wanted[name]["dtype"]) for name in wanted})
            return {name: np.asarray(results[name]) for name in names}

        return run
