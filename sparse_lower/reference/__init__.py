"""The NumPy reference interpreter of the source ops (docs/source_ops.md): their readable, executable definition.

`run(model, feeds)` executes a whole graph; `submanifold_conv`, `sparse_conv`, `sparse_deconv`,
`sparse_max_pool`, `coalesce`, `to_sparse` and `to_dense` are the ops themselves as plain NumPy functions with keyword attributes;
`conv_pairs` lists the (tap, input row, output row) pairs a conv node sums over; inside `counting_pairs`,
each conv's runs record how many pairs each of its taps multiplied (what a check's inputs reached).
This package depends on `sparse_lower.schemas` only and shares no code with the lowering it checks.
"""

from .evaluator import run
from .ops import (coalesce, conv_pairs, counting_pairs, sparse_conv, sparse_deconv, sparse_max_pool, submanifold_conv,
                  to_dense, to_sparse)

__all__ = ["run", "conv_pairs", "counting_pairs", "submanifold_conv", "sparse_conv", "sparse_deconv", "sparse_max_pool", "coalesce",
           "to_sparse", "to_dense"]
