"""Whole-graph execution: onnx's ReferenceEvaluator, with the source ops supplied as `new_ops`.

The standard ops around the sparse ones (Relu, Add, Reshape, Cast, ...) therefore come from onnx's own
reference implementation, not from us.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from ..errors import SparseLowerError
from ..float16 import holds_float16, to_float32
from ..onnx_conventions import SOURCE_DOMAIN
from ..schemas import attributes
from . import ops


class _SourceOp(OpRun):
    """Runs one source-op node through its NumPy definition in `ops`.

    The attributes are re-read through `schemas.attributes` rather than taken from the ones OpRun
    loaded, so that a name the op does not define is refused with a SparseLowerError naming the node
    (OpRun would turn the unexpected keyword into an anonymous TypeError).
    """

    op_domain = SOURCE_DOMAIN
    definition = None

    def _run(self, *inputs, **_loaded_attributes):
        node = self.onnx_node
        result = self.definition(*inputs, name=node.name, **attributes(node))
        return result if isinstance(result, tuple) else (result,)


# The class names are the op types: ReferenceEvaluator matches new_ops by (op_domain, class name).
class SubmanifoldConv(_SourceOp):
    definition = staticmethod(ops.submanifold_conv)


class SparseConv(_SourceOp):
    definition = staticmethod(ops.sparse_conv)


class SparseDeconv(_SourceOp):
    definition = staticmethod(ops.sparse_deconv)


class SparseMaxPool(_SourceOp):
    definition = staticmethod(ops.sparse_max_pool)


class Coalesce(_SourceOp):
    definition = staticmethod(ops.coalesce)


class ToSparse(_SourceOp):
    definition = staticmethod(ops.to_sparse)


class ToDense(_SourceOp):
    definition = staticmethod(ops.to_dense)


SOURCE_OP_RUNS = (SubmanifoldConv, SparseConv, SparseDeconv, SparseMaxPool, Coalesce, ToSparse, ToDense)


def run(model: onnx.ModelProto | str | os.PathLike, feeds: dict) -> dict[str, np.ndarray]:
    """Execute a model holding source ops on `feeds`; return every graph output by name.

    A model converted to float16 (its weights, values or outputs) computes in float32 from its float16
    values, as docs/source_ops.md defines it (float16 accepted, computed in float32): the model is
    widened first, and float16 feeds of what are then float32 inputs are widened with it."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(os.fspath(model))
    initialized = {t.name for t in model.graph.initializer}
    missing = [v.name for v in model.graph.input if v.name not in initialized and v.name not in feeds]
    if missing:
        raise SparseLowerError(f"no feed for the model input{'s' if len(missing) > 1 else ''} "
                               f"{', '.join(map(repr, missing))}", fix="feed every input of the model by its name")
    if holds_float16(model):
        model = to_float32(model)[0]
        floats = {v.name for v in model.graph.input if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
        feeds = {name: np.asarray(value, np.float32) if name in floats else value for name, value in feeds.items()}
    evaluator = ReferenceEvaluator(model, new_ops=list(SOURCE_OP_RUNS))
    outputs = evaluator.run(None, feeds)
    return dict(zip(evaluator.output_names, outputs))
