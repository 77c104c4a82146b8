"""Op counts of a model, and of two side by side (convert's before/after table), for the command line."""

from __future__ import annotations

from collections import Counter

import onnx

from ..report import render


def op_counts(model: onnx.ModelProto) -> Counter:
    return Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


def before_after(before: onnx.ModelProto, after: onnx.ModelProto) -> str:
    """Op counts of two models side by side (polygraphy / onnxsim style)."""
    a, b = op_counts(before), op_counts(after)
    rows = [[op, a.get(op, 0), b.get(op, 0)] for op in sorted(a.keys() | b.keys())]
    rows.append(["(nodes)", sum(a.values()), sum(b.values())])
    rows.append(["(initializers)", len(before.graph.initializer), len(after.graph.initializer)])
    return render(["op", "before", "after"], rows)
