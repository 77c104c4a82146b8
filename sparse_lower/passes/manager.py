"""The pass manager: runs passes in order, checks their contracts, and says where a failure happened.

A pass is an object with a `name` and three methods, after onnx-ir's and torch.fx's pass infra:
`requires(model)` raises when the model is not what the pass was written for, `call(model)` returns
the transformed model, `ensures(model)` raises when the pass did not deliver what it promises. When
anything fails the user learns at which step, in words (the passes before it ran), which is the first
thing needed to debug a lowering.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol, Sequence

import onnx

from ..errors import SparseLowerError


class Pass(Protocol):
    name: str  # for --dump-dir file names
    step: str  # what it does, in words, for messages ("lowering for the gpu target")

    def requires(self, model: onnx.ModelProto) -> None: ...

    def call(self, model: onnx.ModelProto) -> onnx.ModelProto: ...

    def ensures(self, model: onnx.ModelProto) -> None: ...


class PassError(SparseLowerError):
    """A pass failed; the message says which step of how many, in words."""


class PassManager:
    """Runs `passes` in order.

    `verify` is called on the model after every pass (tests pass the lowered-model checker here);
    `dump_dir` receives the model after each pass as `NN_<pass>.onnx`, for debugging a lowering.
    """

    def __init__(self, passes: Sequence[Pass], verify: Callable[[onnx.ModelProto], None] | None = None,
                 dump_dir: str | Path | None = None):
        self.passes = list(passes)
        self.verify = verify
        self.dump_dir = Path(dump_dir) if dump_dir else None

    def run(self, model: onnx.ModelProto) -> onnx.ModelProto:
        if self.dump_dir:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            onnx.save(model, str(self.dump_dir / "00_input.onnx"))
        for index, p in enumerate(self.passes, start=1):
            try:
                p.requires(model)
                model = p.call(model)
                p.ensures(model)
                if self.verify:
                    self.verify(model)
            except SparseLowerError as error:
                failure = PassError(f"{error} (step {index} of {len(self.passes)}: {p.step})")
                failure.node, failure.reason, failure.fix = error.node, error.reason, error.fix
                raise failure from error
            if self.dump_dir:
                onnx.save(model, str(self.dump_dir / f"{index:02d}_{p.name}.onnx"))
        return model
