"""One spconv convolution module as one source-op node, as `sparse_lower.export` writes it.

spconv_calls.py runs the module during the trace and writes the node; this module says which node it
is, from the module and the tensors it read and returned: the op type, the weight in source layout, the
attributes, and where the output's coords come from.
What spconv computes is reproduced (docs/formats.md), with the conventions spconv_rules.py defines
once for every reader and writer of spconv modules:

* `conv1x1` (spconv's fast path, whatever the declared kind): a 1×1 `SubmanifoldConv` whose weight
  is the module's memory read as `[Cin, Cout]`; it keeps its input coords;
* `inverse` (SparseInverseConv): a `SparseDeconv` with the geometry of the forward conv of the same
  `indice_key` and the output padding that restores that conv's input extent; its output coords are
  that conv's input coords (`target_coords`);
* `transposed` (SparseConvTranspose): a `SparseDeconv` whose extent is spconv's (which ignores the
  dilation), reached through the output padding or the end pads;
* `subm`: a `SubmanifoldConv` on its input coords; otherwise a `SparseConv` with symmetric pads.

`fused_activation` reads the activation a conv module applies itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SparseLowerError
from ..spconv_rules import inverse_output_padding, source_weight, weight_from_matmul_memory


@dataclass
class ConvNode:
    """What the export writes for one conv module run."""

    op_type: str
    weight: np.ndarray  # source layout
    bias: np.ndarray
    channel_axis: int  # the output-channel axis of the weight (a batch norm folds along it)
    attrs: dict
    coords: str  # the output coords: "new" (the node's own), "input" or "target" (the inverse conv's)


def conv_node(module, x, output, name: str) -> ConvNode:
    """The node of the spconv conv `module` run on the SparseConvTensor `x`, giving `output`."""
    weight = module.weight.detach().cpu().float().numpy()
    bias = (module.bias.detach().cpu().float().numpy() if module.bias is not None
            else np.zeros(module.out_channels, np.float32))
    attrs = {"spatial_shape": [int(s) for s in x.spatial_shape]}
    if module.conv1x1:
        # spconv's fast path multiplies by weight.view(Cin, Cout), whatever the declared layout
        attrs["kernel_shape"] = [1] * module.ndim
        return ConvNode("SubmanifoldConv", source_weight(weight_from_matmul_memory(weight), transposed=False), bias,
                        0, attrs, "input")
    if module.inverse:
        attrs.update(_inverse_geometry(module, x, name))
        return ConvNode("SparseDeconv", source_weight(weight, transposed=True), bias, 1, attrs, "target")
    if module.transposed:
        attrs.update(_transposed_geometry(module, x, output, name))
        return ConvNode("SparseDeconv", source_weight(weight, transposed=True), bias, 1, attrs, "new")
    if module.subm:
        attrs.update(kernel_shape=list(module.kernel_size), dilations=list(module.dilation))
        return ConvNode("SubmanifoldConv", source_weight(weight, transposed=False), bias, 0, attrs, "input")
    attrs.update(kernel_shape=list(module.kernel_size), strides=list(module.stride),
                 pads=list(module.padding) * 2, dilations=list(module.dilation))
    return ConvNode("SparseConv", source_weight(weight, transposed=False), bias, 0, attrs, "new")


def fused_activation(module, add_input, name: str) -> tuple[str, dict] | None:
    """The (op type, attributes) of the activation the conv `module` applies to its output, or None;
    refused together with an `add_input`."""
    from cumm import tensorview as tv

    activation = module.act_type
    if activation == tv.gemm.Activation.None_:
        return None
    if add_input is not None:
        raise SparseLowerError("a conv module with both a fused activation and add_input cannot be exported",
                               name, fix="apply the activation after the add, outside the conv module")
    ops = {tv.gemm.Activation.ReLU: ("Relu", {}), tv.gemm.Activation.Sigmoid: ("Sigmoid", {}),
           tv.gemm.Activation.LeakyReLU: ("LeakyRelu", {"alpha": float(module.act_alpha)})}
    if activation not in ops:
        raise SparseLowerError(f"fused activation {activation} cannot be exported", name,
                               fix="use ReLU, LeakyReLU or Sigmoid")
    return ops[activation]


def _inverse_geometry(module, x, name: str) -> dict:
    """SparseInverseConv: the forward conv's geometry, and the output padding that gives back its
    input extent (docs/source_ops.md)."""
    forward = x.find_indice_pair(module.indice_key)
    if forward is None:
        raise SparseLowerError(f"no forward convolution with indice_key '{module.indice_key}' ran before",
                               name, fix="give the inverse conv the indice_key of a SparseConv run earlier")
    kernel, stride, padding, dilation = (list(forward.ksize), list(forward.stride), list(forward.padding),
                                         list(forward.dilation))
    if list(module.kernel_size) != kernel:
        raise SparseLowerError(f"kernel {list(module.kernel_size)} differs from the forward conv's {kernel}",
                               name, fix="give the inverse conv the forward conv's kernel size")
    extent = [int(s) for s in forward.spatial_shape]
    output_padding = inverse_output_padding(extent, kernel, stride, padding, dilation)
    return {"kernel_shape": kernel, "strides": stride, "pads": padding * 2, "dilations": dilation,
            "output_padding": output_padding}


def _transposed_geometry(module, x, output, name: str) -> dict:
    """SparseConvTranspose: spconv's output extent ignores the dilation; reach it through the
    output padding where it is larger than ours, through the end pads where smaller."""
    kernel, stride, padding, dilation = (list(module.kernel_size), list(module.stride), list(module.padding),
                                         list(module.dilation))
    output_padding, end_pads = [], []
    for S, S_out, k, s, p, d in zip(x.spatial_shape, output.spatial_shape, kernel, stride, padding, dilation):
        extra = int(S_out) - (s * (int(S) - 1) + d * (k - 1) + 1 - 2 * p)
        if extra >= max(s, d):
            raise SparseLowerError(f"output extent {list(output.spatial_shape)} cannot be expressed", name,
                                   fix="use an output_padding smaller than the stride")
        output_padding.append(max(extra, 0))
        end_pads.append(p - min(extra, 0))
    return {"kernel_shape": kernel, "strides": stride, "pads": padding + end_pads, "dilations": dilation,
            "output_padding": output_padding}
