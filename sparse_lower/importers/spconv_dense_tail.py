"""What a module computes with torch after `.dense()` (a BEV neck, a dense head, OpenPCDet's pillar
backbones' `conv5`), written into the same ONNX file by torch's own ONNX exporter rather than translated
op by op by the tracer (spconv_tracer.py): anything torch.onnx exports works.

The tracer marks every tensor computed from a dense tensor by a function it does not translate as part
of the *dense tail*. The module is then run a second time under torch.onnx's tracing with the sparse part
hidden from it: tracing is off until a `.dense()` call, which returns a graph input (the dense tensor
the first run saw) and turns tracing on, and every spconv module runs with tracing off. torch.onnx thus
writes the dense tail alone, as a function of the `.dense()` results; `splice` joins it to the traced
sparse part at those tensors (onnx.compose), and onnx-graphsurgeon removes what only the tail's own
reading of them used.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import onnx
import onnx_graphsurgeon as gs
from onnx import compose

from ..onnx_conventions import OPSET


def flatten(result) -> list:
    """The tensors a module returns, in order, through lists, tuples and dicts."""
    if isinstance(result, (list, tuple)):
        return [item for element in result for item in flatten(element)]
    if isinstance(result, dict):
        return [item for element in result.values() for item in flatten(element)]
    return [result]


@contextlib.contextmanager
def _sparse_part_untraced(torch, spconv, module, boundaries: list):
    """Inside: tracing off until the first `.dense()`, each `.dense()` returning the next of `boundaries`
    and turning tracing on, and tracing off inside every spconv module."""
    from spconv.pytorch import conv, pool

    state = torch._C._get_tracing_state()
    returned = iter(boundaries)
    saved = []

    def dense(x, channels_first: bool = True):
        torch._C._set_tracing_state(state)
        return next(returned)

    def untraced(module, args):
        saved.append(torch._C._get_tracing_state())
        torch._C._set_tracing_state(None)

    def traced_again(module, args, output):
        torch._C._set_tracing_state(saved.pop())

    handles = [hook for m in module.modules() if isinstance(m, (conv.SparseConvolution, pool.SparseMaxPool))
               for hook in (m.register_forward_pre_hook(untraced), m.register_forward_hook(traced_again))]
    original = spconv.SparseConvTensor.dense
    spconv.SparseConvTensor.dense = dense
    torch._C._set_tracing_state(None)
    try:
        yield
    finally:
        torch._C._set_tracing_state(state)
        spconv.SparseConvTensor.dense = original
        for handle in handles:
            handle.remove()


def tail_model(torch, spconv, module, example, boundaries: dict, picks: dict[int, str]) -> onnx.ModelProto:
    """The dense tail as ONNX: inputs named as `boundaries` (graph value name -> the `.dense()` result
    of the first run, in call order), outputs the returned tensors at the indices of `picks`, named as
    it says. Run inside `spconv_inference`."""

    class Tail(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, *dense):
            with _sparse_part_untraced(torch, spconv, self.inner, list(dense)):
                items = flatten(self.inner(example))
            return tuple(items[index] for index in picks)

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(Tail(), tuple(boundaries.values()), buffer, dynamo=False, opset_version=OPSET,
                          input_names=list(boundaries), output_names=list(picks.values()),
                          training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=True)
    return onnx.load_from_string(buffer.getvalue())


def splice(model: onnx.ModelProto, tail: onnx.ModelProto, outputs: list[str]) -> onnx.ModelProto:
    """`model` (whose outputs include the tail's inputs) and `tail` joined at the tail's inputs, with
    the graph outputs `outputs` in that order; what nothing reads any more is removed."""
    tail = compose.add_prefix(tail, "tail.", rename_inputs=False, rename_outputs=False)
    tail.ir_version = model.ir_version
    joined = compose.merge_models(model, tail, io_map=[(value.name, value.name) for value in tail.graph.input],
                                  outputs=outputs, producer_name=model.producer_name)
    graph = gs.import_onnx(joined)
    by_name = {tensor.name: tensor for tensor in graph.outputs}
    graph.outputs = [by_name[name] for name in outputs]  # merge_models puts the tail's last
    return without_unread_nodes(model, graph.cleanup())


def without_unread_nodes(model: onnx.ModelProto, cleaned: gs.Graph) -> onnx.ModelProto:
    """`cleaned` (onnx-graphsurgeon's graph of `model`, cleaned up: what no output reads removed) as a model
    with `model`'s IR version and producer."""
    result = gs.export_onnx(cleaned.toposort(), do_type_check=False)
    result.ir_version, result.producer_name = model.ir_version, model.producer_name
    return result
