"""Hand-written foreign sparse-conv models, in the forms the real exporters write (NVIDIA's exptool:
`ai.onnx` opset 11, the traced N frozen into the declared shapes, FP16 initializers, KRSC weights,
non-standard attributes; AIMET: the first conv on (indices, features), later ones on the previous output,
falsy attributes left out). While `ForeignGraph` writes a node it also records the layer's meaning in
spconv's own terms, and `evaluate` runs that record (tests/spconv_semantics.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sparse_lower import reference
from spconv_semantics import (ACTIVATIONS, as_dict, spconv_conv, spconv_deconv, spconv_dense, spconv_inverse,
                              spconv_subm)

TRACED_ROWS = 7  # the row count the writers freeze into the declared shapes (a traced frame's)
AIMET_ACTIVATIONS = {"ReLU": ("Relu", {}), "Sigmoid": ("Sigmoid", {}), "LeakyReLU": ("LeakyRelu", {"alpha": 0.01})}


@dataclass(frozen=True)
class Handle:
    name: str  # the features tensor
    grid: tuple
    channels: int
    first: bool = False  # the graph's input features (AIMET: read together with the indices)


class ForeignGraph:
    """Writes an NVIDIA ("nvidia") or AIMET ("aimet") sparse-conv graph and records its spconv meaning."""

    def __init__(self, fmt: str, cin: int, grid, rng, batch=2, name_nodes=True):
        self.fmt, self.rng, self.batch, self.name_nodes = fmt, rng, batch, name_nodes
        self.nodes, self.initializers, self.program, self.keys = [], [], [], {}
        if fmt == "nvidia":
            self.inputs = [helper.make_tensor_value_info("0", TensorProto.FLOAT16, [TRACED_ROWS, cin])]
        else:
            self.inputs = [helper.make_tensor_value_info("indices", TensorProto.INT32, [TRACED_ROWS, 1 + len(grid)]),
                           helper.make_tensor_value_info("features", TensorProto.FLOAT, [TRACED_ROWS, cin])]
        self.x = Handle("0" if fmt == "nvidia" else "features", tuple(grid), cin, first=True)
        self.count = 0

    def _name(self, stem):
        self.count += 1
        return f"{stem}_{self.count}"

    def _node(self, op_type, inputs, outputs, domain="", **attrs):
        name = self._name(op_type) if self.name_nodes else ""
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, domain=domain, **attrs))
        return self.nodes[-1]

    def _weight(self, stem, value):
        """An initializer as the format stores it (NVIDIA: FP16); returns the values it holds."""
        dtype = np.float16 if self.fmt == "nvidia" else np.float32
        name = self._name(stem)
        self.initializers.append(numpy_helper.from_array(value.astype(dtype), name))
        return value.astype(dtype).astype(np.float32)

    def conv(self, x: Handle, kind: str, cout: int, kernel, stride=1, padding=0, dilation=1, output_padding=0,
             key="", activation="None", bias=True, weight_shape=None, weight=None, drop=(), **overrides) -> Handle:
        """`weight` (else random of `weight_shape`, else of the layer's shape) in KRSC; `drop` names
        attributes to leave out, `overrides` sets others."""
        n = len(x.grid)
        kernel, stride, padding, dilation, output_padding = (
            (v,) * n if isinstance(v, int) else tuple(v) for v in (kernel, stride, padding, dilation, output_padding))
        if weight is None:
            weight = self.rng.standard_normal(weight_shape or (cout, *kernel, x.channels)) / 3
        w = self._weight("W", weight)
        b = self._weight("B", self.rng.standard_normal(cout) / 3) if bias else np.zeros(cout, np.float32)
        if kind == "subm":
            out_grid = x.grid
        elif kind == "conv":
            out_grid = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                             for s, k, st, p, d in zip(x.grid, kernel, stride, padding, dilation))
        elif kind == "deconv":
            out_grid = tuple((s - 1) * st - 2 * p + k + op
                             for s, k, st, p, op in zip(x.grid, kernel, stride, padding, output_padding))
        else:
            out_grid = self.keys[key][0].grid if key in self.keys else x.grid
        attrs = dict(ndim=n, input_spatial_shape=list(x.grid), output_spatial_shape=list(out_grid),
                     in_channels=x.channels, out_channels=cout, kernel_size=list(kernel), output_bound=200000,
                     stride=list(stride), dilation=list(dilation), padding=list(padding),
                     transposed=int(kind == "deconv"), inverse=int(kind == "inverse"),
                     output_padding=list(output_padding), groups=1, subm=int(kind == "subm"), rulebook=key or None,
                     activation=activation, input_shape=[TRACED_ROWS, x.channels], output_shape=[TRACED_ROWS, cout])
        if self.fmt == "aimet":  # AIMET: rulebook is "subm<flag>", falsy values are not written, no fused act
            attrs.update(rulebook=f"subm{attrs['subm']}", activation="None", output_spatial_shape=None,
                         output_padding=None, output_shape=None)
            attrs = {k: v for k, v in attrs.items() if v or isinstance(v, list)}
        attrs.update(overrides)
        attrs = {k: v for k, v in attrs.items() if v is not None and k not in drop}
        weights = [self.initializers[-2 if bias else -1].name] + ([self.initializers[-1].name] if bias else [])
        out = self._name("y")
        if self.fmt == "nvidia":
            self._node("SparseConvolution", [x.name, *weights], [out], **attrs)
        else:
            inputs = ["indices", x.name] if x.first else [x.name]
            self._node("SparseConvolution", [*inputs, *weights], [out], domain="spconv", **attrs)
        y = Handle(out, out_grid, cout)
        if key and kind != "inverse":
            self.keys.setdefault(key, (x, stride, padding, dilation))
        forward = self.keys.get(key)
        act = {name.lower(): f for name, f in ACTIVATIONS.items()}.get(activation.lower())

        # spconv's 1x1 fast path (one tap; stride 1 unless submanifold) multiplies the rows by
        # weight.view(Cin, Cout): the stored memory, reinterpreted rather than transposed.
        if int(np.prod(kernel)) == 1 and (kind == "subm" or int(np.prod(stride)) == 1) and kind != "inverse":
            w = np.ascontiguousarray(w.reshape(x.channels, cout).T).reshape(w.shape)

        def run(env):
            source = env[x.name]
            if kind == "subm":
                result = spconv_subm(source, w, b, dilation)
            elif kind == "conv":
                result = spconv_conv(source, w, b, stride, padding, dilation, out_grid)
            elif kind == "deconv":
                result = spconv_deconv(source, w, b, stride, padding, out_grid)
            else:
                result = spconv_inverse(source, w, b, env[forward[0].name], *forward[1:])
            env[out] = {site: act(v) for site, v in result.items()}
        self.program.append(run)
        if self.fmt == "aimet" and activation != "None":
            op_type, extra = AIMET_ACTIVATIONS[activation]
            activated = self._name("act")
            self._node(op_type, [out], [activated], **extra)
            self.program.append(lambda env: env.__setitem__(activated, env[out]))
            y = Handle(activated, out_grid, cout)
        return y

    def relu(self, x: Handle) -> Handle:
        out = self._name("relu")
        self._node("Relu", [x.name], [out])
        self.program.append(lambda env: env.__setitem__(out, {k: np.maximum(v, 0) for k, v in env[x.name].items()}))
        return Handle(out, x.grid, x.channels)

    def add(self, a: Handle, b: Handle) -> Handle:
        out = self._name("add")
        self._node("Add", [a.name, b.name], [out])
        self.program.append(lambda env: env.__setitem__(out, {k: v + env[b.name][k] for k, v in env[a.name].items()}))
        return Handle(out, a.grid, a.channels)

    def scatter_dense(self, x: Handle, layout="zyx", output_shape=None, **overrides):
        """ScatterDense: `format` names the coordinates' axes; the dense axes are in their order."""
        shape = output_shape or [self.batch, x.channels, *x.grid]
        out = self._name("dense")
        attrs = {"input_spatial_shape": list(x.grid), "format": layout, "output_shape": shape, **overrides}
        self._node("ScatterDense", [x.name], [out], domain="spconv" if self.fmt == "aimet" else "", **attrs)
        self.program.append(lambda env: env.__setitem__(out, spconv_dense(
            env[x.name], self.batch, x.channels, x.grid).reshape(shape)))
        return out, shape

    def reshape(self, dense, dims):
        out = self._name("reshape")
        self._node("Reshape", [dense[0]], [out], dims=dims)  # NVIDIA: no shape input, a `dims` attribute
        self.program.append(lambda env: env.__setitem__(out, env[dense[0]].reshape(dims)))
        return out, dims

    def transpose(self, dense, dims):
        out = self._name("transpose")
        self._node("Transpose", [dense[0]], [out], dims=dims)  # NVIDIA: `dims` instead of `perm`
        self.program.append(lambda env: env.__setitem__(out, np.transpose(env[dense[0]], dims)))
        return out, [dense[1][d] for d in dims]

    def build(self, *outputs) -> onnx.ModelProto:
        float_type = TensorProto.FLOAT16 if self.fmt == "nvidia" else TensorProto.FLOAT
        values = []
        for out in outputs:
            if isinstance(out, Handle):
                values.append(helper.make_tensor_value_info(out.name, float_type, [TRACED_ROWS, out.channels]))
            else:
                values.append(helper.make_tensor_value_info(out[0], float_type, list(out[1])))
        graph = helper.make_graph(self.nodes, f"{self.fmt}_scn", self.inputs, values, self.initializers)
        opsets = [helper.make_opsetid("ai.onnx", 11)] if self.fmt == "nvidia" else \
            [helper.make_opsetid("", 16), helper.make_opsetid("spconv", 1)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="hand")
        model.ir_version = 6
        self.outputs, self.model = outputs, model
        return model

    def random_input(self, active=60):
        volume = int(np.prod(self.x.grid))
        sites = self.rng.choice(self.batch * volume, size=min(active, self.batch * volume), replace=False)
        coords = np.column_stack([sites // volume, *np.unravel_index(sites % volume, self.x.grid)]).astype(np.int64)
        features = self.rng.standard_normal((len(coords), self.x.channels)).astype(np.float16).astype(np.float32)
        return features, coords

    def feeds(self, features, coords):
        return {"0": features, "coords": coords} if self.fmt == "nvidia" else {"features": features, "indices": coords}

    def evaluate(self, features, coords) -> list:
        env = {self.x.name: as_dict(features, coords)}
        for run in self.program:
            run(env)
        return [env[out.name] if isinstance(out, Handle) else env[out[0]] for out in self.outputs]


def assert_outputs_match(graph: ForeignGraph, imported: onnx.ModelProto, features, coords, results=None):
    """The imported model's outputs (through `results` or the source-op reference) equal spconv's."""
    results = results or reference.run(imported, graph.feeds(features, coords))
    for out, want in zip(graph.outputs, graph.evaluate(features, coords)):
        if isinstance(out, Handle):
            got = as_dict(results[out.name], results[f"{out.name}_coords"])
            assert got.keys() == want.keys()
            for site in want:
                np.testing.assert_allclose(got[site], want[site], rtol=1e-4, atol=1e-4)
        else:
            np.testing.assert_allclose(results[out[0]], want, rtol=1e-4, atol=1e-4)


# -- one-layer models for the refusal tests (tests/test_importers.py, tests/test_hostile.py) ----------

def one_conv(fmt="nvidia", kind="subm", **overrides):
    g = ForeignGraph(fmt, 3, (6, 7, 8), np.random.default_rng(1))
    out = g.conv(g.x, kind, 4, 3, stride=1 if kind == "subm" else 2, **overrides)
    return g.build(out), g.nodes[-1].name


def scatter_model(**attrs):
    g = ForeignGraph("nvidia", 3, (6, 7, 8), np.random.default_rng(1))
    a = g.conv(g.x, "subm", 4, 3)
    out = g.scatter_dense(a, **attrs)
    return g.build(out), g.nodes[-1].name
