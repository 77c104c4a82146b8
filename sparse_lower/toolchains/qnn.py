"""Qualcomm's NPU through onnxruntime-qnn: the segment compiled by QNN's HTP backend (the Hexagon tensor
processor, simulated on x86) for the Snapdragon Ride Flex SoC (SA8255P, HTP v73), into an onnxruntime
EPContext model that holds the compiled context binary: a deployment loads it without compiling again.

Segments run on the HTP in fp16 (`enable_htp_fp16_precision`), or quantized with every tensor in QDQ
form, 8 or 16 bits per layer (sparse_lower/quantization/htp.py).
Where each node runs is onnxruntime's own record of what each execution provider took
(`session.record_ep_graph_assignment_info`): the QNN provider's nodes run on the HTP, the rest fall back
to onnxruntime's CPU provider and are listed as fallbacks.

Measured (docs/toolchains.md): in the rows layout every combine runs wholly on the HTP except
`ScatterElements` (onnxruntime's CPU); the image layout computes wrong numbers on the HTP for the patent
2-D and head stacks (32 % and 160 % off) and is refused. Quantized, the CenterPoint backbone (unfold
combine, 16 of 19 layers at 16 bits) runs wholly on the HTP within 2 % of float on the real frames.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from ..errors import SparseLowerError
from ..quantization.htp import OUTSIDE_CALIBRATION, WholeGraphQdq
from .base import Run, Toolchain
from .prepare import fed
from .quiet import output_to

SOC_MODEL = "52"  # QNN's number for the SA8255P (Snapdragon Ride Flex)
HTP_ARCH = "73"


class Qnn(Toolchain):
    name = "qnn"
    title = "Qualcomm QNN HTP (onnxruntime-qnn, simulated)"
    modules = ("onnxruntime_qnn",)
    distribution = "onnxruntime-qnn"
    suffix = ".qnn"  # an onnxruntime model (EPContext) with the context binary inside
    precision = "fp16"
    image_layout_wrong = ("QNN's HTP computes the nna image layout wrong (4-D '{image}': 32 % and 160 % off on the "
                          "patent 2-D and head stacks, measured)")

    def int8_form(self) -> WholeGraphQdq:
        """Every tensor quantized (quantization/htp.py), the 16-bit ranges reaching past the calibration
        frames' (`OUTSIDE_CALIBRATION`). The search holds it to 1.5 %: the HTP computed the CenterPoint
        backbone's plan (15 wide) 0.2-0.5 % further off than onnxruntime's CPU computes its files, 2.11 %
        and 2.03 % on the real frames against 1.64 % and 1.81 %."""
        return WholeGraphQdq(search_limit=1.5e-2, margins=OUTSIDE_CALIBRATION)

    def build(self, model: onnx.ModelProto, path: Path) -> None:
        log = path.with_suffix(".log")
        log.unlink(missing_ok=True)
        path.unlink(missing_ok=True)  # onnxruntime refuses to write over a context model
        options = htp_session_options()
        options.add_session_config_entry("ep.context_enable", "1")
        options.add_session_config_entry("ep.context_embed_mode", "1")
        options.add_session_config_entry("ep.context_file_path", str(path))
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        session = _session(path.with_suffix(".onnx"), options, log)
        placement = [(node.op_type, "HTP" if part.ep_name == _ep_name() else "CPU", node.name)
                     for part in session.get_provider_graph_assignment_info() for node in part.get_nodes()]
        path.with_suffix(".placement.json").write_text(json.dumps(placement) + "\n")

    def placement(self, path: Path) -> list[tuple[str, str, str]]:
        return [tuple(row) for row in json.loads(path.with_suffix(".placement.json").read_text())]

    def load(self, path: Path, model: onnx.ModelProto) -> Run:
        session = _session(path, htp_session_options(), path.with_suffix(".log"))
        names = [value.name for value in model.graph.output]
        return lambda inputs: dict(zip(names, session.run(names, fed(model, inputs))))


def _ep_name() -> str:
    import onnxruntime_qnn

    return onnxruntime_qnn.get_ep_name()


def htp_session_options():
    """Session options with the QNN provider on the HTP backend (fp16 for float ops) ahead of the CPU."""
    import onnxruntime as ort
    import onnxruntime_qnn

    if not any(device.ep_name == _ep_name() for device in ort.get_ep_devices()):
        ort.register_execution_provider_library(_ep_name(), onnxruntime_qnn.get_library_path())
    options = ort.SessionOptions()
    options.log_severity_level = 3  # its warnings about features of Windows on Arm
    devices = [device for device in ort.get_ep_devices() if device.ep_name == _ep_name()]
    options.add_provider_for_devices(devices, {
        "backend_path": onnxruntime_qnn.get_qnn_htp_path(), "soc_model": SOC_MODEL, "htp_arch": HTP_ARCH,
        "enable_htp_fp16_precision": "1", "offload_graph_io_quantization": "0"})
    return options


def _session(path: Path, options, log: Path):
    """An onnxruntime session of `path` with QNN, QNN's own printing sent to `log`."""
    import onnxruntime as ort

    try:
        with output_to(log):
            return ort.InferenceSession(str(path), options)
    except Exception as error:  # onnxruntime's Fail/InvalidGraph carry QNN's message
        raise SparseLowerError(f"QNN could not compile {path.name}: {error}", fix=f"read its log {log}") from None
