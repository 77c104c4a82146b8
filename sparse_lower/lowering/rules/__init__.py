"""The lowering rules, one module per source op, each a `Rule` (rule.py): match / check / rewrite.

    ToSparse         to_sparse.py         ActiveSites → IndexedUnfold
    SubmanifoldConv  submanifold_conv.py  SubmanifoldMap → compute (gpu/, nna/ or portable/)
    SparseConv       sparse_conv.py       StridedMap → compute
    SparseDeconv     sparse_deconv.py     TransposedMap or TargetMap → compute
    ToDense          to_dense.py          SiteIndex → IndexedFold
    SparseMaxPool    sparse_max_pool.py   StridedMap → the maximum over each output's rows (table_reduce.py)
    Coalesce         coalesce.py          CoalesceMap → the sum or maximum over each site's rows

(the custom ops named are the index tables of gpu, nna and hybrid; the portable target builds the same
tables from standard ops: lowering/index_tables.py, portable/). The three convs share conv_rule.py, the
two ops without weights reduce_rule.py; checks.py holds the refusals several rules share. The rules are the same for every target: which
compute form a conv gets is the target's policy (LoweringContext.compute_for), where its tables come
from the target's `LoweringContext.tables`. On nna the boundary ops take the custom ops: an
accelerator cannot look coordinates up.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from .coalesce import CoalesceRule
from .rule import Refusal, Rule
from .sparse_conv import SparseConvRule
from .sparse_deconv import SparseDeconvRule
from .sparse_max_pool import SparseMaxPoolRule
from .submanifold_conv import SubmanifoldConvRule
from .to_dense import ToDenseRule
from .to_sparse import ToSparseRule

RULES: tuple[Rule, ...] = (ToSparseRule(), SubmanifoldConvRule(), SparseConvRule(), SparseDeconvRule(), ToDenseRule(),
                           SparseMaxPoolRule(), CoalesceRule())


def rule_for(node: gs.Node) -> Rule | None:
    """The rule that lowers `node`, or None for a node no rule is about (standard ops, unknown ops)."""
    return next((rule for rule in RULES if rule.match(node)), None)


__all__ = ["RULES", "Refusal", "Rule", "rule_for"]
