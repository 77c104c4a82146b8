"""`sparse_lower.export`: a PyTorch module with spconv or MinkowskiEngine layers as a source-op ONNX model
(docs/formats.md#sparse_lowerexport), for users who have the module rather than a file.

    import sparse_lower
    x = spconv.SparseConvTensor(features, coords_int32, spatial_shape, batch_size)
    model = sparse_lower.export(net, x, "net.onnx")            # an onnx.ModelProto, also saved
    model = sparse_lower.export(minkunet, (features, coors))   # a module that takes tensors
    lowered = sparse_lower.lower(model, target="gpu")

torch's own exporter (`torch.onnx.export`, TorchScript-based) writes the whole module: whatever it
computes with torch (batch norms, activations, products of branches, reshapes, a dense neck and heads,
coordinate arithmetic) is torch.onnx's job. Only the sparse engine's calls become source ops
(spconv_calls.py, minkowski_calls.py: `engine_for` picks the engine); cleanup.py then folds what
the trace left around them (Cast pairs, batch norms after convs, VoxelNeXt's `torch.unique` +
`index_add_` into `Coalesce`). torch and the engine are
imported when it runs, never when sparse_lower is imported.

Graph inputs: for a SparseConvTensor example, `features` float32 [N, Cin] and `coords` int64
[N, 1 + D]; for a tuple of arguments, one input per tensor, named `features` and `coords` where they
are one float and one integer tensor of N rows, else after the forward's parameters (integer tensors
become int64 inputs, cast back to the module's own type); other arguments are fixed at their example
value. Outputs: `out_features` / `out_coords` for a sparse result, `output` for a tensor, numbered
(`output0_features`, `output1`, ...) when the module returns several. Every row count stays dynamic.

The model computes the module up to the order of rows: a strided layer's rows come sorted (spconv's
come in its own order), so a torch call that reads a row by its position reads another row.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx

from ..errors import SparseLowerError
from ..onnx_conventions import IR_VERSION, OPSET, SOURCE_DOMAIN

INSTALL_HINT = 'pip install "sparse-lower[spconv]" (torch 2.13.0 and spconv 2.3.8)'
MINKOWSKI_HINT = "bash tools/bench/install_minkowski.sh (MinkowskiEngine 0.5.4, built for the CPU)"
TORCHSPARSE_HINT = "bash tools/bench/install_torchsparse.sh CHECKOUT (TorchSparse 1.4.0 from its source, for the CPU)"


@dataclass(frozen=True)
class Engine:
    """The sparse engine a module runs on, as the export needs it: how to run the module for inference,
    the replaced calls (`calls(module, max_spatial_shape, **settings)`, a context yielding the export's
    state), its sparse tensor type, how to build one from the graph's features and int64 coords, and what
    an eager run of the module tells the calls beforehand (`eager`: MinkowskiEngine's and TorchSparse's
    strides, the step of the frame's origin), where the engine needs it."""

    name: str
    inference: Callable
    calls: Callable
    sparse_type: type
    build: Callable  # (features, coords int64, like: the example) -> the engine's sparse tensor
    parts: Callable  # (sparse tensor) -> (features, coords int64) as the graph outputs them
    eager: Callable | None = None  # (run: the module on the example) -> what `calls` takes besides, by keyword


def _spconv_engine() -> Engine:
    import spconv.pytorch as spconv

    from .spconv_calls import engine_calls, spconv_inference

    def build(features, coords, like):
        return spconv.SparseConvTensor(features, coords.int(), list(like.spatial_shape), int(like.batch_size))

    return Engine("spconv", spconv_inference, engine_calls, spconv.SparseConvTensor, build,
                  lambda x: (x.features, x.indices.long()))


def _minkowski_engine() -> Engine:
    import MinkowskiEngine as ME

    from .minkowski_calls import deepest_strides, engine_calls, minkowski_inference

    def build(features, coords, like):
        return ME.SparseTensor(features, coords.int(), tensor_stride=like.tensor_stride)

    return Engine("MinkowskiEngine", minkowski_inference, engine_calls, ME.SparseTensor, build,
                  lambda x: (x.F, x.C.long()), deepest_strides)


def _torchsparse_engine() -> Engine:
    import torchsparse

    from .torchsparse_calls import engine_calls, torchsparse_deepest_strides, torchsparse_inference

    def build(features, coords, like):
        return torchsparse.SparseTensor(features, coords.int(), like.stride)

    return Engine("TorchSparse", torchsparse_inference, engine_calls, torchsparse.SparseTensor, build,
                  lambda x: (x.F, x.C.long()), torchsparse_deepest_strides)


def engine_for(module, example) -> Engine:
    """The engine of `example` (a sparse tensor of spconv or MinkowskiEngine), else of the module's layers."""
    # MinkowskiEngine's classes live in modules named MinkowskiConvolution, MinkowskiSparseTensor, ...
    layers = module.modules() if hasattr(module, "modules") else []
    kinds = {type(example).__module__} | {type(m).__module__ for m in layers}
    if any(kind.startswith("Minkowski") for kind in kinds):
        try:
            return _minkowski_engine()
        except ImportError as error:
            raise SparseLowerError(f"export of MinkowskiEngine modules needs MinkowskiEngine ({error})",
                                   fix=MINKOWSKI_HINT) from error
    if any(kind.startswith("torchsparse") for kind in kinds):
        try:
            return _torchsparse_engine()
        except ImportError as error:
            raise SparseLowerError(f"export of TorchSparse modules needs TorchSparse ({error})",
                                   fix=TORCHSPARSE_HINT) from error
    try:
        return _spconv_engine()
    except ImportError as error:
        raise SparseLowerError(f"export needs torch and spconv, which are not installed ({error})",
                               fix=INSTALL_HINT) from error


def _framework_calls(module, calls):
    """The replaced calls of a framework above the engine (Pointcept's point transformers), else none; the
    context yields the (file, line) of values the trace fixes that the framework knows no output reads."""
    from .pointcept_calls import pointcept_calls, uses_pointcept

    return pointcept_calls(module, calls) if uses_pointcept(module) else contextlib.nullcontext(set())


@dataclass
class Traced:
    """An exported model, the example as its feeds, and what the module returned on it (by output name)."""

    model: onnx.ModelProto
    feeds: dict
    outputs: dict


def trace(module, example, max_spatial_shape=None) -> Traced:
    """The source-op ONNX model of `module`, traced on `example`: a sparse tensor of the module's engine
    (spconv's `SparseConvTensor`, MinkowskiEngine's `SparseTensor`), or the tuple of the module's positional
    arguments. `max_spatial_shape`: where the grid is not fixed (a grid computed from the frame, or
    MinkowskiEngine, which has none), the largest grid a frame may have (default: traced_calls.default_bound,
    2^16 per axis in 3-D); a frame past it is refused at run time."""
    try:
        import torch
    except ImportError as error:
        raise SparseLowerError(f"export needs torch, which is not installed ({error})", fix=INSTALL_HINT) from error
    from . import cleanup, refusals
    from .traced_calls import index_add_symbolic

    engine = engine_for(module, example)
    if not isinstance(module, torch.nn.Module):
        raise SparseLowerError(f"the module must be a torch.nn.Module, got {type(module).__name__}",
                               fix="give the network (an nn.Module, e.g. spconv.SparseSequential(...))")
    wrapper = _wrapper(torch, engine, module, example)
    settings = {}
    if engine.eager is not None:
        with engine.inference(module):
            settings = engine.eager(lambda: wrapper(*wrapper.tensors))
    buffer = io.BytesIO()
    torch.onnx.register_custom_op_symbolic("aten::index_add", index_add_symbolic, OPSET)
    try:
        with engine.inference(module), engine.calls(module, max_spatial_shape, **settings) as calls, \
                _framework_calls(module, calls) as understood, warnings.catch_warnings(record=True) as caught:
            wrapper.kept = calls.results
            warnings.simplefilter("always")  # kept: the tracer's word on values it fixed; shown: none
            with _without_the_ir_dump():
                torch.onnx.export(wrapper, wrapper.tensors, buffer, dynamo=False, opset_version=OPSET,
                                  input_names=wrapper.input_names, custom_opsets={SOURCE_DOMAIN: 1},
                                  dynamic_axes=_dynamic_axes(wrapper),
                                  training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=True)
    except SparseLowerError:
        raise
    except Exception as error:  # torch.onnx's refusal of a torch call: say where the module made it
        raise refusals.explained(error, wrapper, __file__) from error
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::index_add", OPSET)
    if max_spatial_shape is not None and not calls.bounded:
        raise SparseLowerError(f"max_spatial_shape {list(max_spatial_shape)} does nothing: every grid of the module is "
                               "fixed (the spatial_shape its sparse tensors are given)",
                               fix="leave max_spatial_shape out; it bounds grids the module computes from the frame "
                                   "or an engine without grids (MinkowskiEngine, TorchSparse)")
    model = cleanup.cleaned(onnx.load_from_string(buffer.getvalue()), wrapper.output_names)
    model.ir_version = IR_VERSION
    model.producer_name = "sparse_lower.export"
    refusals.refuse_frozen(model, wrapper.input_names, caught, understood)
    refusals.note_frozen(model, caught, understood)
    onnx.checker.check_model(model)
    feeds = {name: tensor.detach().numpy() for name, tensor in zip(wrapper.input_names, wrapper.tensors)}
    return Traced(model, feeds, dict(zip(wrapper.output_names, wrapper.results)))


IR_DUMP = "Torch IR graph at exception:"


@contextlib.contextmanager
def _without_the_ir_dump():
    """stdout as the module writes it while traced, less the TorchScript graph torch.onnx prints when it
    refuses an operator ("Torch IR graph at exception: …", dozens of lines before the refusal, which
    refusals.explained words with the call and its line). torch 2.13's legacy exporter logs it from
    C++ whatever its log setting (it tests the setting's getter, not its value), so file descriptor 1 is
    caught."""
    from ..toolchains.quiet import output_to

    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "stdout.log"
        try:
            with output_to(log, stderr=False):
                yield
        finally:
            sys.stdout.write(log.read_text(errors="replace").split(IR_DUMP)[0] if log.exists() else "")
            sys.stdout.flush()



def _dynamic_axes(wrapper) -> dict:
    """Every input's first axis dynamic: "N" where it has the rows of the first 2-d float input (the
    features), else an axis of its own (a dict's batch offsets)."""
    rows = next((t.shape[0] for t in wrapper.tensors if t.is_floating_point() and t.dim() == 2), None)
    return {name: {0: "N" if rows is None or t.shape[0] == rows else f"{name}_length"}
            for name, t in zip(wrapper.input_names, wrapper.tensors) if t.dim()}


def _wrapper(torch, engine, module, example):
    """The module as torch.onnx traces it: a torch module taking the graph inputs (`tensors`, named
    `input_names`; coordinates int64) and returning tensors only, which names them (`output_names`)
    when it runs."""

    class Exported(torch.nn.Module):
        def __init__(self, arguments, tensors, input_names):
            super().__init__()
            self.module, self.engine = module, engine
            self.arguments, self.tensors, self.input_names = arguments, tensors, input_names
            self.output_names: list[str] = []
            self.results: list = []
            self.kept: list = []

        def forward(self, *tensors):
            result = self.module(*self.arguments(*tensors))
            self.output_names = _output_names(torch, engine, result)
            outputs = tuple(_graph_tensors(engine, result))
            self.results = [output.detach().numpy().copy() for output in outputs]
            return outputs + tuple(self.kept)  # every engine call's result read, see traced_calls.TracedCalls

    if isinstance(example, engine.sparse_type):
        features, coords = engine.parts(example)
        return Exported(lambda f, c: (engine.build(f, c, example),), (features.float(), coords.long()),
                        ["features", "coords"])
    if isinstance(example, torch.Tensor):
        example = (example,)
    if not isinstance(example, (tuple, list)):
        raise SparseLowerError(f"the example must be a {engine.name} {engine.sparse_type.__name__} or a tuple of "
                               f"the module's arguments, got {type(example).__name__}",
                               fix="give spconv.pytorch.SparseConvTensor(features, coords, spatial_shape, batch), "
                                   "ME.SparseTensor(features, coords) or (features, coords, ...)")
    example = list(example)
    slots = [(i, None) for i, item in enumerate(example) if isinstance(item, torch.Tensor)]
    slots += [(i, key) for i, item in enumerate(example) if isinstance(item, dict)
              for key, value in item.items() if isinstance(value, torch.Tensor)]
    if not slots:
        raise SparseLowerError("the example holds no tensor", fix="give the module's tensor arguments")
    given = [example[i] if key is None else example[i][key] for i, key in slots]

    def arguments(*tensors):
        rebuilt = [dict(item) if isinstance(item, dict) else item for item in example]
        for (i, key), tensor, like in zip(slots, tensors, given):
            if key is None:
                rebuilt[i] = tensor.to(like.dtype)
            else:
                rebuilt[i][key] = tensor.to(like.dtype)
        return rebuilt

    tensors = tuple(t if t.is_floating_point() else t.long() for t in given)
    return Exported(arguments, tensors, _argument_names(module, slots, given))


def _argument_names(module, slots, tensors) -> list[str]:
    """The graph inputs' names (`tensors` at their `slots`): `features` and `coords` for one float and one
    integer tensor of N rows, a dict's tensors by their keys, else the forward's parameter names."""
    floats = [t for t in tensors if t.is_floating_point()]
    if (all(key is None for _, key in slots) and len(tensors) == 2 and len(floats) == 1
            and all(t.dim() == 2 for t in tensors) and tensors[0].shape[0] == tensors[1].shape[0]):
        return ["features" if t.is_floating_point() else "coords" for t in tensors]
    try:
        parameters = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        parameters = []
    return [key if key is not None else parameters[i] if i < len(parameters) else f"input{i}" for i, key in slots]


def _output_names(torch, engine, result) -> list[str]:
    """The graph outputs' names for what the module returned (see the module docstring)."""
    items = _flatten(result)
    names = []
    for index, item in enumerate(items):
        prefix = f"output{index}" if len(items) > 1 else None
        if isinstance(item, engine.sparse_type):
            names += [f"{prefix or 'out'}_features", f"{prefix or 'out'}_coords"]
        elif isinstance(item, torch.Tensor):
            names.append(prefix or "output")
        else:
            raise SparseLowerError(f"the model returns a {type(item).__name__}, which is not a tensor",
                                   fix="return SparseConvTensors and tensors (or lists, tuples, dicts of them); of a "
                                   "Pointcept Point, the tensors you need (point.feat)")
    return names


def _graph_tensors(engine, result) -> list:
    """What the module returned as the graph's tensors: a sparse tensor's features, then its int64 coords."""
    tensors = []
    for item in _flatten(result):
        tensors += list(engine.parts(item)) if isinstance(item, engine.sparse_type) else [item]
    return tensors


def _flatten(result) -> list:
    """The values a module returns, in order, through lists, tuples and dicts; None is left out."""
    if isinstance(result, (list, tuple)):
        return [item for element in result for item in _flatten(element)]
    if isinstance(result, dict):
        return [item for element in result.values() for item in _flatten(element)]
    return [] if result is None else [result]
