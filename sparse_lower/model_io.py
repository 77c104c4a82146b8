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
from pathlib import Path

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
    if not isinstance(model, (onnx.ModelProto, str, os.PathLike)):
        raise SparseLowerError(f"the model is of type {type(model).__name__}",
                               fix="give an onnx.ModelProto or the path of an .onnx file")
    return default_domain_spelled_empty(model if isinstance(model, onnx.ModelProto) else _read(os.fspath(model)))


def output_folder(path: str | os.PathLike, what: str) -> Path:
    """The folder `path` (`what` it is for, in messages), made where missing; a file there is refused
    rather than met as mkdir's FileExistsError."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise SparseLowerError(f"{what} {folder} is a file, where a folder goes",
                               fix="give a folder (made where missing), or move the file")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _refused(path: str, what: str, fix: str = "give the .onnx file the exporter wrote") -> SparseLowerError:
    return SparseLowerError(f"cannot read the model '{path}': {what}", fix=fix)


def readable(path: str) -> str:
    """`path`, once it is a file with something in it (refused as load refuses it otherwise)."""
    if not os.path.exists(path):
        raise _refused(path, "no such file", "check the path")
    if os.path.isdir(path):
        raise _refused(path, "a folder, not an ONNX model")
    if os.path.getsize(path) == 0:
        raise _refused(path, "the file is empty",
                       "write the model again: the export or the copy stopped before writing it")
    return path


def unreadable(path: str) -> SparseLowerError:
    """Why the file at `path` is no model, in the words load uses: what it is instead."""
    return _refused(path, _what_it_is(path))


def _read(path: str) -> onnx.ModelProto:
    """The model in the file at `path`. What is not a model is named as what it is: protobuf parses an
    empty file as an empty model (which validation would then call "IR version 0") and says "Wire format
    was corrupt" of a text file, a frame or a cut copy alike."""
    def refused(what: str, fix: str = "give the .onnx file the exporter wrote") -> SparseLowerError:
        return _refused(path, what, fix)

    readable(path)
    try:
        model = onnx.load(path)
    except DecodeError as error:
        raise refused(_what_it_is(path)) from error
    except OSError as error:  # permissions, or external data missing beside the file
        raise refused(f"{error.strerror or error}{f': {error.filename}' if error.filename else ''}",
                      "check the file, its permissions and its external data files") from error
    if model.ir_version == 0 and not model.HasField("graph"):
        raise refused(_what_it_is(path))
    return model


def _what_it_is(path: str) -> str:
    """What a file that does not parse as a model holds, for the message."""
    with open(path, "rb") as stream:
        head = stream.read(4096)
    if head.startswith(b"PK\x03\x04"):
        return "an .npz archive, not an ONNX model (frames and inputs go to --inputs, --frames or after the model)"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if text and all(c.isprintable() or c.isspace() for c in text):
        return "a text file, not an ONNX model"
    return "not an ONNX model, or a truncated one (protobuf cannot parse it)"


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
