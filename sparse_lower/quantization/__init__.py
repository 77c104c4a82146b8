"""Post-training quantization, in one place: the gpu target's convs in 8 bits, and the int8 accelerator
segments of a partition in the form each toolchain needs.

    gpu.py              `sparse_lower.quantize`: the gpu form's convs as IndexedConvInt8, calibrated on frames
    calibration.py      what each accelerator segment reads on calibration frames; MinMax ranges of tensors
    products.py         the products by a weight, their layers, the network's first and last layers
    forms.py            the quantized forms a toolchain names (`Toolchain.int8_form`), and precisions
    qdq.py              onnxruntime's QDQ form of the products (onnxruntime, OpenVINO's 7-bit weights, TVM)
    htp.py              QNN HTP's whole-graph QDQ form
    mixed_precision.py  which layers keep 16-bit activations for int8 to stay within 2 %, measured

Nothing here imports sparse_lower.toolchains: a toolchain names its form, and compile_partition and the
search take it from there.
"""

from .forms import QUANTIZED_PRECISION, QuantizedForm
from .mixed_precision import Plan, QuantizedRuns, choose_wide_layers

__all__ = ["QUANTIZED_PRECISION", "Plan", "QuantizedForm", "QuantizedRuns", "choose_wide_layers"]
