"""spconv 2.x conventions reproduced in more than one place: by the importers, which read the files
exporters write from spconv modules, by sparse_lower.export (exporter/spconv_modules.py), and by the
reference networks' writers (models/), which write them: the weight layout (KRSC), the 1×1 fast
path's reading of the weight memory, the inverse conv's geometry and the fused LeakyReLU's slope.

One definition each, so that the reading and the writing cannot drift apart.
"""

from __future__ import annotations

import numpy as np

# torch.nn.LeakyReLU's default slope: the module an exporter fuses into the conv. (spconv's own fused
# activation has act_alpha = 0 by default, which would make a "LeakyReLU" a ReLU.) No sparse-conv format
# in the wild carries the slope, so the writers use this one and the importers assume it.
LEAKY_RELU_ALPHA = 0.01


def source_weight(krsc: np.ndarray, transposed: bool) -> np.ndarray:
    """spconv's KRSC weight `[Cout, *K, Cin]` in the source ops' layout (docs/source_ops.md): `[Cout, Cin,
    *K]` for a conv, `[Cin, Cout, *K]` for a deconv (the same tap, its matrix transposed:
    W_deconv[ci, co, k] = W[co, k, ci]); float32, contiguous."""
    return np.ascontiguousarray(np.moveaxis(krsc, -1, 0 if transposed else 1), dtype=np.float32)


def weight_from_matmul_memory(memory: np.ndarray) -> np.ndarray:
    """The KRSC weight a spconv module on its 1×1 fast path (`runs_as_matmul`) computes with: it multiplies
    the rows by `weight.view(Cin, Cout)`, reading the stored `[Cout, 1.., Cin]` memory as the matrix
    [Cin, Cout], a reinterpretation rather than a transpose. What the importers read from a file."""
    cout, cin = memory.shape[0], memory.shape[-1]
    return np.ascontiguousarray(memory.reshape(cin, cout).T).reshape(memory.shape)


def matmul_memory(weight: np.ndarray) -> np.ndarray:
    """The reverse of `weight_from_matmul_memory`: what a spconv module on its 1×1 fast path must store to
    compute with the KRSC `weight`. What the writers of spconv modules and files store."""
    cout, cin = weight.shape[0], weight.shape[-1]
    return np.ascontiguousarray(weight.reshape(cout, cin).T).reshape(weight.shape)


def inverse_output_padding(extent, kernel, stride, padding, dilation) -> list[int]:
    """The output_padding that makes a SparseDeconv with a forward conv's geometry end at that conv's input
    `extent` (docs/source_ops.md), as spconv's inverse conv returns to the forward conv's input sites:
    (S + 2p − d·(K − 1) − 1) mod s per dimension."""
    return [int((S + 2 * p - d * (k - 1) - 1) % s) for S, k, s, p, d in zip(extent, kernel, stride, padding, dilation)]


def runs_as_matmul(kind: str, kernel, stride) -> bool:
    """spconv's 1×1 fast path: a kernel of one tap (and stride 1 unless submanifold; an inverse conv
    module has stride 1) is run as `features @ weight.view(Cin, Cout)` on the input rows."""
    return int(np.prod(kernel)) == 1 and (kind in ("subm", "inverse") or int(np.prod(stride)) == 1)
