"""The interface every lowering rule implements, after onnxscript's rewrite rules: `match` says whether
the rule is about a node, `check` says why the node cannot be lowered (a `Refusal` carrying the reason
and the fix, or None), and `rewrite` replaces the node by its lowered form.

A rule's refusals live with the rule: the validator (passes/validate.py) asks each source node's rule
before anything is rewritten, so a condition is written and worded once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from ...errors import SparseLowerError
from ...onnx_conventions import SOURCE_DOMAIN
from ..context import LoweringContext


@dataclass(frozen=True)
class Refusal:
    """Why a node cannot be lowered, and what the user changes so that it can."""

    reason: str
    fix: str | None = None

    def error(self, node: gs.Node) -> SparseLowerError:
        return SparseLowerError(self.reason, node.name, self.fix)


class Rule(ABC):
    """The lowering of one source op (`op_type`), with its input/output counts: (min inputs, max
    inputs, outputs) in `arity`, and the names of the inputs that may not be absent in `required`."""

    op_type = ""
    arity: tuple[int, int, int] = (0, 0, 0)
    required: tuple[str, ...] = ()

    def match(self, node: gs.Node) -> bool:
        return node.domain == SOURCE_DOMAIN and node.op == self.op_type

    def check(self, node: gs.Node) -> Refusal | None:
        """The first reason `node` cannot be lowered, or None."""
        return next(self._connections(node), None) or next(self.refusals(node), None)

    def _connections(self, node: gs.Node) -> Iterator[Refusal]:
        """The input and output counts, and the required inputs present: what every other check reads."""
        low, high, outputs = self.arity
        if not low <= len(node.inputs) <= high or len(node.outputs) != outputs:
            yield Refusal(f"{node.op} takes {low}–{high} inputs and {outputs} outputs, got "
                          f"{len(node.inputs)} and {len(node.outputs)}", "see docs/source_ops.md")
            return
        for index, role in enumerate(self.required):
            if not node.inputs[index].name:
                yield Refusal(f"the required input {index} ({role}) is empty", f"connect the {role} to input {index}")

    def refusals(self, node: gs.Node) -> Iterator[Refusal]:
        """Every reason the node, correctly connected, cannot be lowered (only the first is reported)."""
        yield from ()

    @abstractmethod
    def rewrite(self, node: gs.Node, ctx: LoweringContext) -> None:
        """Replace `node` by its lowered form (requires: `check` found nothing)."""
