"""Reading models: the one place that turns a path into a ModelProto, for every layer of the package.

ONNX names its default operator domain two ways, "" and "ai.onnx", and real exporters write the second
(NVIDIA's Lidar_AI_Solution tools declare `opset_import = [("ai.onnx", 11)]`). Tools differ in which
spelling they resolve: the version converter keeps "ai.onnx" and then checks nodes it adds in domain ""
against opset 1. So every model enters the package with the default domain spelled "", and nothing
downstream has to know the other spelling.
"""

from __future__ import annotations

import json
import os

import onnx
from google.protobuf.message import DecodeError

from .errors import SparseLowerError
from .onnx_conventions import DEFAULT_DOMAIN_ALIAS, OPTIONS_KEY, STANDARD_DOMAINS


def recorded_options(model: onnx.ModelProto) -> dict:
    """The target and options a lowered model was lowered with ({} for a model the package did not lower)."""
    return json.loads(next((p.value for p in model.metadata_props if p.key == OPTIONS_KEY), "{}"))


def load(model: onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    """A ModelProto from a ModelProto or a path, its default domain spelled "" (a copy where it was not:
    the caller's model is never changed)."""
    if not isinstance(model, onnx.ModelProto):
        try:
            model = onnx.load(os.fspath(model))
        except (OSError, DecodeError) as error:
            raise SparseLowerError(f"cannot read the model '{model}': {error}") from error
    return default_domain_spelled_empty(model)


def _graphs(graph: onnx.GraphProto):
    """The graph and every subgraph of its nodes' attributes (If/Loop/Scan bodies)."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else
                        attr.graphs if attr.type == onnx.AttributeProto.GRAPHS else []):
                yield from _graphs(sub)


def _nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for g in _graphs(model.graph) for n in g.node] + [n for f in model.functions for n in f.node]


def default_domain_spelled_empty(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with the "ai.onnx" spelling of the default domain replaced by "" in its opset imports,
    nodes and functions; the same object when it has none. Importing both spellings at two different
    versions is a contradiction and refused."""
    versions = {o.version for o in model.opset_import if o.domain in STANDARD_DOMAINS}
    if not any(o.domain == DEFAULT_DOMAIN_ALIAS for o in model.opset_import) and \
            not any(n.domain == DEFAULT_DOMAIN_ALIAS for n in _nodes(model)):
        return model
    if len(versions) > 1:
        raise SparseLowerError(f"the model imports the default ONNX domain twice, as '' and "
                               f"'{DEFAULT_DOMAIN_ALIAS}', at opsets {sorted(versions)}",
                               fix="import the default domain once")
    model = onnx.ModelProto.FromString(model.SerializeToString())
    opsets = [o for o in model.opset_import if o.domain not in STANDARD_DOMAINS]
    if versions:
        opsets.insert(0, onnx.helper.make_opsetid("", versions.pop()))
    del model.opset_import[:]
    model.opset_import.extend(opsets)
    for node in _nodes(model):
        if node.domain == DEFAULT_DOMAIN_ALIAS:
            node.domain = ""
    for function in model.functions:
        for opset in function.opset_import:
            if opset.domain == DEFAULT_DOMAIN_ALIAS:
                opset.domain = ""
    return model


def fed_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a run must feed (older exporters also list initializers as inputs)."""
    initializers = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in initializers]


def exposing(model: onnx.ModelProto, names, elem_type: int | None = None) -> onnx.ModelProto:
    """A copy of `model` that also returns the values `names` (those it does not return already), to read
    what a run computes inside it: calibration ranges, active sites per level, resolved types. Declared
    as tensors of `elem_type`, or left untyped for onnxruntime to resolve (None)."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    returned = {o.name for o in exposed.graph.output}
    exposed.graph.output.extend(onnx.ValueInfoProto(name=name) if elem_type is None
                                else onnx.helper.make_tensor_value_info(name, elem_type, None)
                                for name in dict.fromkeys(names) if name not in returned)
    return exposed
