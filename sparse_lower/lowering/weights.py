"""Weight re-layout, done once at compile time.

The unfolded input has one row per output and columns ordered (tap, input channel), the taps in the
row-major order of the kernel (the ONNX weight order). The weight matrix is laid out to match:
row k·Cin + ci, column co.
"""

from __future__ import annotations

import numpy as np


def conv_matrix(weights: np.ndarray) -> np.ndarray:
    """ONNX Conv weights [Cout, Cin, *K] as the unfold matrix [K·Cin, Cout]."""
    cout, cin = weights.shape[:2]
    return weights.reshape(cout, cin, -1).transpose(2, 1, 0).reshape(-1, cout).astype(np.float32)


def deconv_matrix(weights: np.ndarray) -> np.ndarray:
    """ONNX ConvTranspose weights [Cin, Cout, *K] as the unfold matrix [K·Cin, Cout].

    A transposed conv gathers, for output o and tap k, the input i with o = i·s − pb + k·d and
    multiplies it by W[:, :, k]ᵀ; laid out like this it is the same MatMul as a forward conv.
    """
    cin, cout = weights.shape[:2]
    return weights.reshape(cin, cout, -1).transpose(2, 0, 1).reshape(-1, cout).astype(np.float32)
