"""What every accelerator toolchain adapter provides (one module per toolchain in this package).

A toolchain takes an accelerator segment (a standalone ONNX model of standard ops with static
shapes), compiles it into its own artifact and runs that artifact in its own runtime. Adapters
import their toolchain only inside `build` and `load`, so that this package imports without any of
them; `missing()` says which pip extra brings one in.
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx

from ..quantization.forms import QUANTIZED_PRECISION, QuantizedForm
from ..quantization.qdq import PartialQdq

Run = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def image_tensor(model: onnx.ModelProto) -> str | None:
    """A 4-D tensor of the segment, whose presence marks the nna image layout; None in the rows layout."""
    return next((value.name for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]
                 if len(value.type.tensor_type.shape.dim) == 4), None)


# the largest error relative to the output's magnitude expected from a precision; every quantized one: 2 %.
# fp16 (unit roundoff 4.9e-4) through the 20 layers of the CenterPoint backbone: 1.2-2.1e-3 measured on
# the real frames (rknn, QNN's HTP), so 5e-3
TOLERANCE = {"fp32": 1e-4, "fp16": 5e-3, **{precision: 2e-2 for precision in QUANTIZED_PRECISION.values()}}


class Toolchain(ABC):
    name: str
    title: str
    modules: tuple[str, ...]  # the Python modules the adapter imports
    distribution: str  # the PyPI distribution whose version is reported
    suffix: str  # of the artifact file
    precision: str = "fp32"  # what the accelerator computes in; once quantized, one of QUANTIZED_PRECISION
    # what the toolchain measurably does wrong with the nna image layout, "{image}" naming a 4-D tensor
    # of the segment; None where it takes that layout
    image_layout_wrong: str | None = None

    @property
    def extra(self) -> str:
        return self.name

    @property
    def tolerance(self) -> float:
        """The largest error relative to the output's magnitude expected from its precision."""
        return TOLERANCE[self.precision]

    def missing(self) -> str | None:
        """Why the toolchain cannot be used here, with the fix; None when it can."""
        absent = [module for module in self.modules if importlib.util.find_spec(module) is None]
        if absent:
            return (f"{self.title} is not installed (Python module '{absent[0]}'): "
                    f"pip install 'sparse-lower[{self.extra}]'")
        return None

    def version(self) -> str:
        return metadata.version(self.distribution)

    def refuses(self, model: onnx.ModelProto) -> tuple[str, str] | None:
        """(why, fix) when this toolchain must not be given the segment (a form measured to convert
        wrongly: by default the image layout where `image_layout_wrong` says why); None when it may."""
        image = image_tensor(model)
        if self.image_layout_wrong is None or image is None:
            return None
        return self.image_layout_wrong.format(image=image), "lower with layout='rows'"

    def int8_form(self) -> QuantizedForm:
        """The quantized form the accelerator needs (sparse_lower.quantization.forms): how compile_partition
        quantizes its segments, what the mixed-precision search measures and holds it to, and what the
        accelerator refuses. By default onnxruntime's QDQ form of the products, which the toolchains that
        read QDQ files run as such."""
        return PartialQdq()

    def adapted(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """The prepared segment as this toolchain must be given it: the same computation in other standard
        ops where the toolchain computes a form wrong; by default the segment itself."""
        return model

    @abstractmethod
    def build(self, model: onnx.ModelProto, path: Path) -> None:
        """Compile the (prepared) segment model into the artifact `path`; `path.with_suffix(".onnx")`
        holds `model` (converters that read only files take it from there)."""

    @abstractmethod
    def load(self, path: Path, model: onnx.ModelProto) -> Run:
        """The artifact as a function from the segment's inputs to its outputs, by name; `model` is the
        prepared segment the artifact was built from (its input order and types)."""

    def placement(self, path: Path) -> list[tuple[str, str, str]]:
        """(op, unit, name) for every op of a built artifact whose toolchain reports where ops run: unit
        "CPU" is a fallback off the accelerator, "input" the conversion of an input into the
        accelerator's layout. Empty where the toolchain does not say."""
        return []
