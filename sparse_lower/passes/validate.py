"""ValidateSourceOps: refuse, before anything is rewritten, every source node the lowering or the
runtime could not execute correctly, naming the node and the fix.

What is checked statically: here, the graph's structure (every input produced, one producer per
tensor, no cycle, imported domains, IR version), op names, and attributes and their ONNX types (through
the schemas); by each node's lowering rule (its `check`), its connections, weight and bias shapes and
dtypes, and the declared dtypes/ranks/widths of features and coords wherever the model declares them.
What only the data can tell (coordinates out of the grid, duplicates) is checked at run time by the
custom ops.
"""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs

from ..errors import SparseLowerError
from ..lowering.rules import rule_for
from ..structure import check_structure
from ..onnx_conventions import SOURCE_DOMAIN
from ..schemas import SOURCE_OPS, attributes


def _check_node(node: gs.Node) -> None:
    """Ask the node's rule: its refusals live with it (lowering/rules/)."""
    rule = rule_for(node)
    if rule is None:
        raise SparseLowerError(f"unknown op '{SOURCE_DOMAIN}::{node.op}'", node.name,
                               f"use one of {', '.join(SOURCE_OPS)}")
    refusal = rule.check(node)
    if refusal is not None:
        raise refusal.error(node)


def source_version(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain == SOURCE_DOMAIN), None)


class ValidateSourceOps:
    """requires: an ONNX model. ensures: every `sparse` node is one the lowering can take."""

    name = "validate"
    step = "checking the source model"

    def requires(self, model: onnx.ModelProto) -> None:
        if not 3 <= model.ir_version <= onnx.IR_VERSION:
            raise SparseLowerError(f"the model has IR version {model.ir_version}; onnx {onnx.__version__} reads IR "
                                   f"versions 3 to {onnx.IR_VERSION}",
                                   fix="stamp the IR version of the onnx release that wrote the model "
                                       "(onnx.helper.make_model does)")
        version = source_version(model)
        if version not in (None, 1):
            raise SparseLowerError(f"the model imports domain '{SOURCE_DOMAIN}' version {version}",
                                   fix="sparse_lower implements version 1 of the sparse ops")

    def call(self, model: onnx.ModelProto) -> onnx.ModelProto:
        check_structure(model)
        for node in model.graph.node:  # attribute types survive only in the protos, not in graphsurgeon
            if node.domain == SOURCE_DOMAIN and node.op_type in SOURCE_OPS:
                attributes(node)
        graph = gs.import_onnx(model)
        names = set()
        for node in graph.nodes:
            if node.name and node.name in names:
                raise SparseLowerError("two nodes share this name", node.name, "give every node a unique name")
            names.add(node.name)
            if node.domain == SOURCE_DOMAIN:
                _check_node(node)
        return model

    def ensures(self, model: onnx.ModelProto) -> None:
        """Validation changes nothing."""
