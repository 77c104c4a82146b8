"""One onnxruntime session that runs frames: the same object runs a local job and serves as a Ray Data
actor, so that both produce the same bytes from the same code.

A frame that cannot be read, does not fit the model or is refused by onnxruntime becomes a failed
`FrameResult` naming the frame and the reason; the worker goes on with the next one. A frame whose
float inputs hold NaN or infinite values runs (those values are its own) and its result carries a warning
that says how many, since the outputs they reach are NaN or infinite too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ..errors import SparseLowerError
from ..runtime import (BROKEN_FRAME, RUNTIME_ERRORS, broken_frame, create_session, drop_padding, fixed_rows, needs_library,
                       pad_rows, quiet_options, runtime_refusal)
from ..verify import non_finite
from .files import frame_feeds, model_inputs, read_frame, write_outputs


@dataclass(frozen=True)
class FrameResult:
    frame: str  # the frame file
    error: str = ""  # why it failed; empty when it ran and its outputs are written
    latency_ms: float = 0.0  # onnxruntime's run of the frame, without reading and writing
    warning: str = ""  # what the outputs hold that the user should know (NaN or infinite inputs)

    @property
    def ok(self) -> bool:
        return not self.error


class FrameWorker:
    """Holds one session of a lowered model (serialized bytes) on `threads` onnxruntime threads (0: its
    default, one per core)."""

    def __init__(self, model: bytes, threads: int = 0, compress: bool = False):
        options = quiet_options()  # a refused frame is reported in its result; onnxruntime's log would repeat it
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = create_session(model, sess_options=options)
        proto = onnx.load_from_string(model)
        self.inputs = model_inputs(proto)
        self.guarded = not needs_library(proto)  # standard ops only: a broken frame gives NaN rather than an error
        self.proto = proto if fixed_rows(proto) else None  # the static form: frames padded, outputs unpadded
        self.outputs = [output.name for output in self.session.get_outputs()]
        self.compress = compress

    def process(self, frame: Path, output: Path) -> FrameResult:
        """Run one frame and write its outputs to `output`; a failure is returned, not raised."""
        try:
            feeds = frame_feeds(read_frame(frame), self.inputs)
            if self.proto is not None:
                feeds = pad_rows(self.proto, feeds)
            start = time.perf_counter()
            values = self.session.run(self.outputs, feeds)
            latency = (time.perf_counter() - start) * 1e3
            if self.guarded and broken_frame(feeds, values):
                raise BROKEN_FRAME
            results = dict(zip(self.outputs, values))
            write_outputs(output, drop_padding(results) if self.proto is not None else results, self.compress)
            said = non_finite(feeds)
            warning = f"{said}: the outputs they reach are not finite either" if said else ""
        except Exception as error:  # one bad frame must not stop the job: it is reported by name
            reason = (str(error) if isinstance(error, SparseLowerError) else str(runtime_refusal(error))
                      if isinstance(error, RUNTIME_ERRORS) else f"{type(error).__name__}: {error}")
            return FrameResult(str(frame), error=reason)
        return FrameResult(str(frame), latency_ms=latency, warning=warning)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Ray Data's batch interface: columns `frame` and `output` in, one result row per frame out."""
        results = [self.process(Path(frame), Path(output)) for frame, output in zip(batch["frame"], batch["output"])]
        return {"frame": np.array([r.frame for r in results]), "error": np.array([r.error for r in results]),
                "latency_ms": np.array([r.latency_ms for r in results], np.float64),
                "warning": np.array([r.warning for r in results])}
