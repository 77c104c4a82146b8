"""The quantized forms of the int8 accelerator segments. A toolchain names the one its accelerator needs
through one hook (`Toolchain.int8_form`); compile_partition and the mixed-precision search take it from
there, so that no toolchain imports the search and nothing here imports a toolchain.

    qdq.PartialQdq         onnxruntime's QDQ form of the products by weights (onnxruntime, OpenVINO with
                           7-bit weights, TVM)
    htp.WholeGraphQdq      every tensor quantized (QNN's HTP)
    CalibratedByToolchain  the toolchain quantizes by itself when it builds (rknn)
    Unsupported            no int8 (LiteRT)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import onnx

from ..errors import SparseLowerError

# the precision of a segment quantized with int8 weights, by the width of its activations
QUANTIZED_PRECISION = {8: "int8", 16: "w8a16"}


class QuantizedForm(ABC):
    # what the mixed-precision search holds this form to in onnxruntime: below 2 % where the accelerator
    # computes the same files measurably further off than onnxruntime's CPU
    search_limit: float = 2e-2

    def refuses(self, model: onnx.ModelProto, activation_bits: int, wide: set[str]) -> tuple[str, str] | None:
        """(why, fix) where the accelerator must not be given `model` quantized so; None where it may."""
        return None

    @abstractmethod
    def ranges(self, model: onnx.ModelProto, samples: list[dict]) -> dict[str, tuple] | None:
        """The ranges `quantized` calibrates `model` with on `samples`: computed once where a caller
        quantizes one segment several ways (the mixed-precision search)."""

    @abstractmethod
    def quantized(self, model: onnx.ModelProto, samples: list[dict], keep_float: set[str],
                  activation_bits: int = 8, wide: set[str] = frozenset(),
                  ranges: dict[str, tuple] | None = None) -> onnx.ModelProto:
        """`model` with int8 weights and `activation_bits` (8 or 16) activations, calibrated on `samples`
        (its inputs), the products in `keep_float` float (or as wide as the form has) and those in `wide`
        with 16-bit activations. `ranges`: `ranges(model, samples)`, computed here when absent."""

    @property
    def measured(self) -> QuantizedForm | None:
        """The form the mixed-precision search runs in onnxruntime in this one's place: itself, or None
        where onnxruntime cannot run it (onnxruntime's PartialQdq then stands in)."""
        return self

    def layer_precision(self, kept: bool, wide: bool, activation_bits: int) -> str:
        """What `quantized` makes of a layer: `kept` (among `keep_float`), `wide` (among `wide`), at
        `activation_bits`. Here the QDQ forms': a kept layer stays float, a wide one (or every one at 16
        bits) takes int8 weights under 16-bit activations."""
        return "float" if kept else "w8a16" if wide or activation_bits == 16 else "w8a8"


class CalibratedByToolchain(QuantizedForm):
    """The toolchain quantizes by itself when it builds, calibrating on the samples that `keep` receives
    with the products to keep wider than 8 bits (the first and last layers' and the wide ones, which it
    keeps in its own wider type: rknn's hybrid quantization, float16). It takes 8-bit activations only
    (`why_8_bits`, `fix`: its refusal of 16 everywhere). The model goes to it float."""

    def __init__(self, keep: Callable[[list[dict], set[str]], None], why_8_bits: str, fix: str):
        self.keep, self.why_8_bits, self.fix = keep, why_8_bits, fix

    def refuses(self, model: onnx.ModelProto, activation_bits: int, wide: set[str]) -> tuple[str, str] | None:
        return (self.why_8_bits, self.fix) if activation_bits != 8 else None

    def ranges(self, model: onnx.ModelProto, samples: list[dict]) -> None:
        return None

    def quantized(self, model: onnx.ModelProto, samples: list[dict], keep_float: set[str],
                  activation_bits: int = 8, wide: set[str] = frozenset(),
                  ranges: dict[str, tuple] | None = None) -> onnx.ModelProto:
        self.keep(samples, set(keep_float) | set(wide))
        return model

    def layer_precision(self, kept: bool, wide: bool, activation_bits: int) -> str:
        return "float16" if kept or wide else "w8a8"  # the toolchain's wider type: rknn's float16

    @property
    def measured(self) -> None:
        return None


class Unsupported(QuantizedForm):
    """No int8: every quantization is refused with `why` and `fix`."""

    def __init__(self, why: str, fix: str):
        self.why, self.fix = why, fix

    def refuses(self, model: onnx.ModelProto, activation_bits: int, wide: set[str]) -> tuple[str, str]:
        return self.why, self.fix

    def ranges(self, model: onnx.ModelProto, samples: list[dict]) -> None:
        raise SparseLowerError(self.why, fix=self.fix)

    def quantized(self, model: onnx.ModelProto, samples: list[dict], keep_float: set[str],
                  activation_bits: int = 8, wide: set[str] = frozenset(),
                  ranges: dict[str, tuple] | None = None) -> onnx.ModelProto:
        raise SparseLowerError(self.why, fix=self.fix)

    @property
    def measured(self) -> None:
        return None
