"""`sparse_lower.export`: a PyTorch spconv model traced to the source-op form (docs/source_ops.md), for
users who have the model. It sits beside the importers of the ONNX formats as the importer of the
module itself; torch and spconv are imported when it runs, never when sparse_lower is imported.

    import sparse_lower
    x = spconv.SparseConvTensor(features, coords_int32, spatial_shape, batch_size)
    model = sparse_lower.export(net, x, "net.onnx")      # an onnx.ModelProto, also saved
    lowered = sparse_lower.lower(model, target="gpu")

`export` runs the module once on the example (see `spconv_inference`) and records what happens:

* the spconv convolution modules (SubMConvNd, SparseConvNd, SparseConvTransposeNd,
  SparseInverseConvNd, or SparseConvolution with the same flags) and SparseMaxPool modules through
  forward hooks; what they compute inside is not traced;
* the torch functions applied to the traced tensors through a `TorchFunctionMode`, whatever calls
  them (an `nn.ReLU` in a `SparseSequential`, `x.replace_feature(F.relu(x.features))`, the
  `SparseConvTensor.__add__` of a residual connection, `torch.cat` of skip features, a `.view` of the
  dense output): Relu, LeakyRelu, Sigmoid, batch norm, Add, Concat, Reshape and Transpose;
* `SparseConvTensor.dense()`, patched for the duration of the export, as `ToDense`;
* the coordinate arithmetic, row concatenation and merging of rows of fully sparse detectors
  (VoxelNeXt's `indices[:, 1:] *= 2`, `torch.cat` of indices, `torch.unique` + `index_add_`):
  spconv_merges.py.

Which node a convolution module becomes is spconv_modules.py's; the graph is written with
graph_writer.GraphWriter.

A batch norm that directly follows a convolution is folded into it; any other becomes Mul + Add.
Anything else applied to a traced tensor is refused with the name of the function.

Graph inputs: `features` float32 [N, Cin] and `coords` int64 [N, 1 + D] (batch, then the spatial
order of the model's `spatial_shape`); outputs: `out_features` / `out_coords` for a sparse result,
`output` for a dense one, numbered (`output0_features`, `output1`, ...) when the module returns
several.

spconv's semantics are reproduced exactly (docs/formats.md): weights go from `[Cout, *K, Cin]` to
`[Cout, Cin, *K]` (`[Cin, Cout, *K]` for the transposed kinds, the same tap index); an inverse
convolution becomes a `SparseDeconv` whose `target_coords` are the input coords of the forward
convolution with the same `indice_key`, with the forward geometry and an output padding that restores
its extent; a 1×1 convolution multiplies by `weight.view(Cin, Cout)`, as spconv's fast path does.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper

from ..errors import SparseLowerError
from ..graph_writer import GraphWriter
from ..onnx_conventions import OPSET, SOURCE_DOMAIN
from ..spconv_rules import LEAKY_RELU_ALPHA
from .spconv_channels import ChannelOps
from .spconv_dense_tail import flatten, splice, tail_model, without_unread_nodes
from .spconv_merges import RowOps, _Value
from .spconv_modules import conv_node, fused_activation

INSTALL_HINT = 'pip install "sparse-lower[spconv]" (torch 2.13.0 and spconv 2.3.8)'


def _torch_and_spconv():
    try:
        import spconv.pytorch as spconv
        import torch
    except ImportError as error:
        raise SparseLowerError(f"export needs torch and spconv, which are not installed ({error})",
                               fix=INSTALL_HINT) from error
    return torch, spconv


@contextlib.contextmanager
def spconv_inference(module):
    """Run an spconv `module` for inference inside the block: eval mode, no gradients, one thread.

    Two workarounds for spconv 2.3.8's CPU kernels: they return wrong sums with more than one torch
    thread, and they refuse a bias at inference ("cpu don't support act and bias"); convolutions with
    a bias therefore run in training mode, where spconv adds the bias after the kernel, which under
    no_grad gives the inference result. Modes and the thread count are restored afterwards.
    """
    torch, _ = _torch_and_spconv()
    from spconv.pytorch.conv import SparseConvolution

    modes = [(m, m.training) for m in module.modules()]
    threads = torch.get_num_threads()
    module.eval()
    for m in module.modules():
        if isinstance(m, SparseConvolution) and m.bias is not None and not m.weight.is_cuda:
            m.train()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_num_threads(threads)
        for m, training in modes:
            m.training = training


def export(module, example, path: str | os.PathLike | None = None) -> onnx.ModelProto:
    """The source-op ONNX model of an spconv `module`, traced by running it on `example` (a
    `spconv.pytorch.SparseConvTensor`); saved to `path` when given. See the module docstring."""
    torch, spconv = _torch_and_spconv()
    if not isinstance(example, spconv.SparseConvTensor):
        raise SparseLowerError(f"the example must be a spconv SparseConvTensor, got {type(example).__name__}",
                               fix="give spconv.pytorch.SparseConvTensor(features, coords, spatial_shape, batch)")
    tracer = _Tracer(torch, spconv, module, example)
    with spconv_inference(module), tracer.hooks(), tracer:
        result = module(example)
    outputs = tracer.outputs(result)
    ours = [output for output in outputs if output[1] is not None]
    if len(ours) == len(outputs):
        model = tracer.build(outputs, f"{type(module).__name__}")
    else:  # a dense tail: spconv_dense_tail.py
        # each .dense() result an output that the tail reads: by its name where the module returns it
        named = {value: wanted for wanted, value, _, _ in ours}
        boundaries = {named.get(name, f"{name}.boundary"): (name, tensor) for name, tensor in tracer.dense_calls}
        model = tracer.build(ours + [(wanted, name, TensorProto.FLOAT, list(tensor.shape))
                                     for wanted, (name, tensor) in boundaries.items() if name not in named],
                             f"{type(module).__name__}")
        with spconv_inference(module):
            tail = tail_model(torch, spconv, module, example,
                              {wanted: tensor for wanted, (_, tensor) in boundaries.items()}, tracer.tail_picks)
        model = splice(model, tail, [wanted for wanted, _, _, _ in outputs])
        onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, os.fspath(path))
    return model


# ---------------------------------------------------------------------------------------------------
# What the graph under construction keeps


@dataclass
class _Conv:
    """A convolution's constants, kept so that a following batch norm can be folded into it."""

    weight: str
    bias: str
    channel_axis: int  # the output-channel axis of the weight


@dataclass
class _BatchNorm:
    """A batch norm emitted as Mul + Add, folded into its producer at build time where possible."""

    mul: onnx.NodeProto
    add: onnx.NodeProto
    scale: np.ndarray
    shift: np.ndarray


# ---------------------------------------------------------------------------------------------------
# The tracer


def _arg(args, kwargs, index: int, name: str, default=None):
    if index < len(args):
        return args[index]
    return kwargs.get(name, default)


_IN_PLACE_OPERATORS = {f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul",
                                                 "and", "or", "xor", "lshift", "rshift")}


def _mutates(func) -> bool:
    """Whether a torch function changes its first argument in place (`x[i] = v`, `x.mul_(2)`, `x *= 2`)."""
    name = getattr(func, "__name__", "")
    return name == "__setitem__" or name in _IN_PLACE_OPERATORS or (name.endswith("_") and not name.endswith("__"))


def _function_name(func) -> str:
    qualified = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    module = getattr(func, "__module__", None)
    return f"{module}.{qualified}" if module and not qualified.startswith(module) else qualified


class _Tracer(RowOps, ChannelOps):
    """Maps torch tensors (by identity, kept alive) to graph values and emits a node per traced call
    (the row and coordinate patterns of fully sparse detectors: RowOps, spconv_merges.py; arithmetic within
    rows: ChannelOps, spconv_channels.py)."""

    def __init__(self, torch, spconv, module, example):
        from torch.overrides import TorchFunctionMode

        self.torch, self.spconv = torch, spconv
        self.module = module
        self.names = {id(m): name or "model" for name, m in module.named_modules()}
        self.values: dict[int, _Value] = {}
        self._alive: list = []  # traced tensors stay alive so that their ids stay theirs
        self.suppressed = 0
        ndim = len(example.spatial_shape)
        cin = example.features.shape[1]
        self.writer = GraphWriter([helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", cin]),
                                   helper.make_tensor_value_info("coords", TensorProto.INT64, ["N", 1 + ndim])])
        self.convs: dict[str, _Conv] = {}  # by features output name
        self.batch_norms: list[_BatchNorm] = []
        self.dense_calls: list[tuple[str, object]] = []  # (value name, tensor) of each .dense() result, in order
        self.tail_picks: dict[int, str] = {}  # the returned items the dense tail computes: index -> output name
        self._track(example.indices, _Value("coords", "coords", grid=tuple(int(s) for s in example.spatial_shape)))
        self._track(example.features, _Value("features", "features", "coords"))
        F = torch.nn.functional
        T = torch.Tensor
        self.handlers = {}
        for functions, handler in (
            ((F.relu, torch.relu, torch.relu_, T.relu, T.relu_), self._relu),
            ((F.leaky_relu, F.leaky_relu_), self._leaky_relu),
            ((F.sigmoid, torch.sigmoid, T.sigmoid, T.sigmoid_), self._sigmoid),
            ((F.batch_norm,), self._batch_norm),
            ((T.__add__, T.__radd__, T.__iadd__, T.add, T.add_, torch.add), self._add),
            ((torch.cat, torch.concat), self._concat),
            ((T.view, T.reshape, torch.reshape, T.flatten, torch.flatten, T.squeeze, torch.squeeze,
              T.unsqueeze, torch.unsqueeze), self._reshape),
            ((T.permute, torch.permute, T.transpose, torch.transpose), self._transpose),
            ((T.contiguous, T.clone, torch.clone, T.detach, torch.detach, T.float, T.cpu, T.int), self._alias),
        ):
            for function in functions:
                self.handlers[function] = handler
        self.handlers.update(self._row_handlers(torch))
        self.handlers.update(self._channel_handlers(torch))
        tracer = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                result = func(*args, **kwargs)
                if not tracer.suppressed:
                    tracer.on_call(func, args, kwargs, result)
                return result

        self.mode = Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)

    # ----- the graph

    def _node(self, op_type: str, inputs: list[str], output: str, name: str, **attrs) -> str:
        """A node of one output, named `output` and `name` made unique; returns the output's name."""
        return self.writer.node(op_type, inputs, [output], self.writer.unique(name), **attrs)[0]

    def _fold_batch_norms(self, outputs: set[str]) -> None:
        """Fold each batch norm whose input is a convolution's features read by nothing else."""
        writer = self.writer
        for bn in self.batch_norms:
            source = bn.mul.input[0]
            conv = self.convs.get(source)
            if conv is None or source in outputs or len(writer.consumers(source)) != 1:
                continue
            weight = writer.array(conv.weight)
            shape = [1] * weight.ndim
            shape[conv.channel_axis] = -1
            writer.set_constant(conv.weight, weight * bn.scale.reshape(shape))
            writer.set_constant(conv.bias, writer.array(conv.bias) * bn.scale + bn.shift)
            for node in (bn.mul, bn.add):
                writer.nodes.remove(node)
                writer.remove_constant(node.input[1])
            self.convs[bn.add.output[0]] = self.convs.pop(source)
            writer.replace(source, bn.add.output[0])

    def build(self, outputs: list[tuple[str, str, int, list]], name: str) -> onnx.ModelProto:
        """The checked model; outputs: (wanted name, value name, element type, shape) per graph output."""
        self._fold_batch_norms({value for _, value, _, _ in outputs})
        infos = [helper.make_tensor_value_info(self.writer.rename(value, wanted), elem_type, shape)
                 for wanted, value, elem_type, shape in outputs]
        model = self.writer.model(name, infos, {"": OPSET, SOURCE_DOMAIN: 1}, producer_name="sparse_lower.export")
        graph = gs.import_onnx(model)
        if len(graph.cleanup().nodes) < len(model.graph.node):  # what the module computed beside its outputs
            model = without_unread_nodes(model, graph)
        onnx.checker.check_model(model)
        return model

    # ----- values

    def _track(self, tensor, value: _Value) -> None:
        self.values[id(tensor)] = value
        self._alive.append(tensor)

    def _value(self, tensor, what: str) -> _Value:
        value = self.values.get(id(tensor)) if isinstance(tensor, self.torch.Tensor) else None
        if value is None:
            raise SparseLowerError(f"{what} reads a tensor that does not come from the example input",
                                   fix="build every sparse tensor from the example by spconv modules, "
                                       "replace_feature and the supported torch functions")
        return value

    def _sparse(self, x, what: str) -> tuple[str, str]:
        """(features name, coords name) of a SparseConvTensor."""
        features = self._value(x.features, what)
        coords = self._value(x.indices, what)
        if features.kind != "features" or self.coords_of(features) != coords.name:
            raise SparseLowerError(f"{what}: the features of the sparse tensor do not lie on its coords",
                                   fix="change features only through replace_feature with rows in the same order")
        return features.name, coords.name

    def _traced(self, item) -> bool:
        if isinstance(item, (list, tuple)):
            return any(self._traced(i) for i in item)
        return isinstance(item, self.torch.Tensor) and id(item) in self.values

    def _has_tensor(self, item) -> bool:
        if isinstance(item, (list, tuple)):
            return any(self._has_tensor(i) for i in item)
        return isinstance(item, self.torch.Tensor)

    def _input(self, item, what: str) -> tuple[str, _Value | None]:
        """A function argument as a graph value: traced tensors by name, others as constants."""
        if isinstance(item, self.torch.Tensor) and id(item) in self.values:
            value = self.values[id(item)]
            return value.name, value
        array = item.detach().cpu().numpy() if isinstance(item, self.torch.Tensor) else np.asarray(item)
        return self.writer.constant(f"{what}.constant", array.astype(np.float32)), None

    # ----- torch functions

    def on_call(self, func, args, kwargs, result) -> None:
        if not (self._traced(args) or self._traced(list(kwargs.values()))):
            return
        handler = self.handlers.get(func)
        kinds = {self.values[id(t)].kind for t in flatten([list(args), list(kwargs.values())])
                 if isinstance(t, self.torch.Tensor) and id(t) in self.values}
        if "tail" in kinds or (handler is None and "dense" in kinds and self._has_tensor(result)):
            for tensor in flatten(result):  # torch.onnx writes it (spconv_dense_tail.py)
                if isinstance(tensor, self.torch.Tensor):
                    self._track(tensor, _Value("", "tail"))
            return
        if handler is None:
            if not self._has_tensor(result) and not _mutates(func):
                return  # shape, dtype, dim() and other queries
            self.cannot_translate(func)
        handler(func, args, kwargs, result)

    @staticmethod
    def cannot_translate(func):
        raise SparseLowerError(
            f"export cannot translate {_function_name(func)} applied to a traced tensor",
            fix="use spconv convolutions and pooling, replace_feature with relu / leaky_relu / sigmoid / batch norm "
                "/ add / cat, reshapes within rows, reductions over channels and channel slices on the features, "
                ".dense() with view / reshape / permute, and VoxelNeXt's coordinate patterns (docs/formats.md)")

    def _unary(self, op_type: str, args, result, **attrs) -> None:
        name, value = self._input(args[0], op_type)
        output = self._node(op_type, [name], f"{name}.{op_type.lower()}", op_type, **attrs)
        self._track(result, _Value(output, value.kind, value.coords))

    def _relu(self, func, args, kwargs, result):
        self._unary("Relu", args, result)

    def _leaky_relu(self, func, args, kwargs, result):
        self._unary("LeakyRelu", args, result, alpha=float(_arg(args, kwargs, 1, "negative_slope", LEAKY_RELU_ALPHA)))

    def _sigmoid(self, func, args, kwargs, result):
        self._unary("Sigmoid", args, result)

    def _batch_norm(self, func, args, kwargs, result):
        name, value = self._input(args[0], "batch_norm")
        mean, var, weight, bias = (_arg(args, kwargs, i, key) for i, key in
                                   ((1, "running_mean"), (2, "running_var"), (3, "weight"), (4, "bias")))
        if mean is None or var is None or _arg(args, kwargs, 5, "training", False):
            raise SparseLowerError("batch norm without running statistics cannot be exported",
                                   fix="keep track_running_stats=True (export runs the model in eval mode)")
        eps = float(_arg(args, kwargs, 7, "eps", 1e-5))
        as_array = lambda t: t.detach().cpu().double().numpy()  # noqa: E731
        scale = 1.0 / np.sqrt(as_array(var) + eps)
        if weight is not None:
            scale = scale * as_array(weight)
        shift = -as_array(mean) * scale
        if bias is not None:
            shift = shift + as_array(bias)
        scale, shift = scale.astype(np.float32), shift.astype(np.float32)
        shape = (-1,) + (1,) * (args[0].dim() - 2)  # per channel, axis 1
        scaled = self._node("Mul", [name, self.writer.constant(f"{name}.bn_scale", scale.reshape(shape))],
                            f"{name}.bn_scaled", "BatchNorm_scale")
        mul = self.writer.nodes[-1]
        output = self._node("Add", [scaled, self.writer.constant(f"{name}.bn_shift", shift.reshape(shape))],
                            f"{name}.bn", "BatchNorm_shift")
        self.batch_norms.append(_BatchNorm(mul, self.writer.nodes[-1], scale, shift))
        self._track(result, _Value(output, value.kind, value.coords))

    def _add(self, func, args, kwargs, result):
        if _arg(args, kwargs, 2, "alpha", 1) != 1:
            raise SparseLowerError("add with alpha other than 1 cannot be exported", fix="scale the operand instead")
        a, value_a = self._input(args[0], "add")
        b, value_b = self._input(_arg(args, kwargs, 1, "other"), "add")
        value = value_a or value_b
        if value_a and value_b and self.coords_of(value_a) != self.coords_of(value_b):
            raise SparseLowerError("adding the features of two sparse tensors on different coords",
                                   fix="add only tensors on the same coords (a residual around subm convs)")
        output = self._node("Add", [a, b], f"{a}.add", "Add")
        self._track(result, _Value(output, value.kind, value.coords))

    def _concat(self, func, args, kwargs, result):
        tensors = _arg(args, kwargs, 0, "tensors")
        items = [self._input(t, "cat") for t in tensors]
        traced = [value for _, value in items if value is not None]
        axis = int(_arg(args, kwargs, 1, "dim", 0)) % result.dim()
        if traced[0].kind in ("features", "coords") and axis == 0:
            self.concat_rows(items, result)
            return
        if len({self.coords_of(value) for value in traced}) > 1:
            raise SparseLowerError("concatenating the features of sparse tensors on different coords",
                                   fix="concatenate only tensors on the same coords")
        output = self._node("Concat", [name for name, _ in items], f"{items[0][0]}.cat", "Concat", axis=axis)
        self._track(result, _Value(output, traced[0].kind, traced[0].coords))

    def _dense_input(self, args, what: str) -> str:
        name, value = self._input(args[0], what)
        if value is None or value.kind != "dense":
            raise SparseLowerError(f"{what} of sparse features cannot be exported (their row count is dynamic)",
                                   fix="reshape only the dense tensor returned by .dense()")
        return name

    def _getitem(self, func, args, kwargs, result):
        value = self._row_value(args[0])
        if value is None:
            super()._getitem(func, args, kwargs, result)  # coords columns (spconv_merges.py)
            return
        self.channel_slice(func, args[0], args[1], result, value)

    def _reshape(self, func, args, kwargs, result):
        value = self._row_value(args[0])
        if value is not None:
            self.reshape_rows(func, args, result, value)
            return
        name = self._dense_input(args, _function_name(func))
        shape = self.writer.constant(f"{name}.shape", np.array(result.shape, np.int64))
        output = self._node("Reshape", [name, shape], f"{name}.reshape", "Reshape")
        self._track(result, _Value(output, "dense"))

    def _transpose(self, func, args, kwargs, result):
        rank = args[0].dim()
        if func in (self.torch.Tensor.transpose, self.torch.transpose):
            perm = list(range(rank))
            a, b = (int(_arg(args, kwargs, i, key)) % rank for i, key in ((1, "dim0"), (2, "dim1")))
            perm[a], perm[b] = perm[b], perm[a]
        else:
            dims = args[1:] or kwargs["dims"]
            if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
                dims = dims[0]
            perm = [int(d) % rank for d in dims]
        value = self._row_value(args[0])
        if value is not None:
            self.transpose_rows(func, perm, result, value)
            return
        name = self._dense_input(args, _function_name(func))
        output = self._node("Transpose", [name], f"{name}.transpose", "Transpose", perm=perm)
        self._track(result, _Value(output, "dense"))

    def _alias(self, func, args, kwargs, result):
        self._track(result, self.values[id(args[0])])

    # ----- spconv modules and .dense()

    @contextlib.contextmanager
    def hooks(self):
        """Forward hooks on every spconv convolution of the module, and `SparseConvTensor.dense`
        patched, for the duration of the block."""
        from spconv.pytorch import conv, pool

        handles = []
        for module in self.module.modules():
            if isinstance(module, (conv.SparseConvolution, pool.SparseMaxPool)):
                handles.append(module.register_forward_pre_hook(self._before_conv))
                handles.append(module.register_forward_hook(self._after_conv, with_kwargs=True))
            elif isinstance(module, (pool.SparseAvgPool, pool.SparseGlobalMaxOrAvgPool)):
                raise SparseLowerError(f"{type(module).__name__} cannot be exported yet", self.names[id(module)],
                                       fix="use SparseMaxPool or a strided SparseConv instead")
        cls = self.spconv.SparseConvTensor
        original = cls.dense
        tracer = self

        def dense(x, channels_first: bool = True):
            tracer.suppressed += 1
            try:
                result = original(x, channels_first)
            finally:
                tracer.suppressed -= 1
            if not tracer.suppressed:
                tracer._dense(x, channels_first, result)
            return result

        cls.dense = dense
        try:
            yield
        finally:
            cls.dense = original
            for handle in handles:
                handle.remove()

    def _dense(self, x, channels_first: bool, result) -> None:
        features, coords = self._sparse(x, ".dense()")
        output = self._node("ToDense", [features, coords], f"{features}.dense", "ToDense", domain=SOURCE_DOMAIN,
                        spatial_shape=list(x.spatial_shape), batch_size=int(x.batch_size))
        if not channels_first:
            ndim = len(x.spatial_shape)
            output = self._node("Transpose", [output], f"{features}.dense_last", "Transpose",
                                perm=[0, *range(2, ndim + 2), 1])
        self._track(result, _Value(output, "dense"))
        self.dense_calls.append((output, result))

    def _before_conv(self, module, args):
        self.suppressed += 1

    def _after_conv(self, module, args, kwargs, output):
        self.suppressed -= 1
        if self.suppressed:
            return
        from spconv.pytorch.pool import SparseMaxPool

        if isinstance(module, SparseMaxPool):
            self.max_pool(module, args[0], output, self.names.get(id(module), type(module).__name__))
            return
        add_input = args[1] if len(args) > 1 else kwargs.get("add_input")
        self._conv(module, args[0], output, add_input)

    def _conv(self, module, x, output, add_input) -> None:
        name = self.names.get(id(module), type(module).__name__)
        features, coords = self._sparse(x, name)
        conv = conv_node(module, x, output, name)
        target = ([self._value(x.find_indice_pair(module.indice_key).indices, name).name] if conv.coords == "target"
                  else [])
        w_name = self.writer.constant(f"{name}.weight", conv.weight)
        b_name = self.writer.constant(f"{name}.bias", conv.bias)
        out_features, out_coords = self.writer.node(
            conv.op_type, [features, coords, w_name, b_name, *target], [f"{name}.features", f"{name}.coords"],
            self.writer.unique(name), domain=SOURCE_DOMAIN, **conv.attrs)
        self.convs[out_features] = _Conv(w_name, b_name, conv.channel_axis)
        coords_value = target[0] if target else coords if conv.coords == "input" else out_coords
        self._track(output.indices, _Value(coords_value, "coords", grid=tuple(int(s) for s in output.spatial_shape)))
        self._track(output.features, _Value(self._conv_epilogue(module, out_features, add_input, name),
                                            "features", coords_value))

    def _conv_epilogue(self, module, features: str, add_input, name: str) -> str:
        """The fused add (`forward(x, add_input)`) and activation of a spconv conv module."""
        activation = fused_activation(module, add_input, name)
        if add_input is not None:
            other, _ = self._sparse(add_input, name)
            features = self._node("Add", [features, other], f"{features}.add", f"{name}.add")
        if activation is None:
            return features
        op_type, attrs = activation
        return self._node(op_type, [features], f"{features}.{op_type.lower()}", f"{name}.{op_type.lower()}", **attrs)

    # ----- outputs

    def outputs(self, result) -> list[tuple[str, str | None, int, list]]:
        """(name, value, element type, shape) per graph output; the value is None for an output of the dense
        tail, whose item index `tail_picks` keeps."""
        items = flatten(result)
        numbered = len(items) > 1
        outputs = []
        for index, item in enumerate(items):
            prefix = f"output{index}" if numbered else None
            if isinstance(item, self.spconv.SparseConvTensor):
                features, coords = self._sparse(item, "the model's output")
                outputs.append((f"{prefix or 'out'}_features", features, TensorProto.FLOAT,
                                [None, int(item.features.shape[1])]))
                outputs.append((f"{prefix or 'out'}_coords", coords, TensorProto.INT64,
                                [None, 1 + len(item.spatial_shape)]))
            elif isinstance(item, self.torch.Tensor):
                value = self._value(item, "the model's output")
                shape = list(item.shape) if value.kind in ("dense", "tail") else [None, *map(int, item.shape[1:])]
                if value.kind == "tail":
                    self.tail_picks[index] = prefix or "output"
                outputs.append((prefix or "output", None if value.kind == "tail" else value.name, TensorProto.FLOAT,
                                shape))
            else:
                raise SparseLowerError(f"the model returns a {type(item).__name__}, which is not a tensor",
                                       fix="return SparseConvTensors and tensors (or lists, tuples, dicts of them)")
        return outputs
