"""Autoware / TIER IV graphs written by hand in the forms AWML's and autoware-ml's writers produce
(`AutowareGraph`), with their spconv meaning (`evaluate`, the NumPy spconv loops of spconv_semantics),
and the encoder the tests build with it: shared by test_autoware (the importer) and
test_portable_runtimes (the portable target on the real frames)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from spconv_semantics import as_dict, spconv_conv, spconv_deconv, spconv_dense, spconv_subm

PAIR_IMPLICIT, PAIR_NATIVE = "GetIndicePairsImplicitGemm", "GetIndicePairs"
COORS = {"awml": [2, 1, 0], "aml": [2, 0, 1]}  # per coors column (z, y, x): the grid axis it becomes
# "direct": the pair op reads a graph input `coors [N, 4]` (batch, c0, c1, c2) itself, as the writers'
# own test networks do


class AutowareGraph:
    """Writes an Autoware graph on a grid (c0, c1, c2) and records its spconv meaning (`evaluate`)."""

    def __init__(self, variant: str, grid, cin: int, rng, native: bool = False):
        self.variant, self.grid, self.rng, self.native = variant, tuple(grid), rng, native
        self.nodes, self.initializers, self.program, self.keys = [], [], [], {}
        self.count = 0
        self.inputs = [helper.make_tensor_value_info("voxel_features", TensorProto.FLOAT, ["voxels_num", cin]),
                       helper.make_tensor_value_info("coors", TensorProto.INT32,
                                                     ["voxels_num", 4 if variant == "direct" else 3])]
        self.x = ("voxel_features", self.grid, cin, self._coordinates())

    def _name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def node(self, op_type, inputs, outputs=1, domain="", **attrs) -> list[str]:
        outs = [self._name(op_type.lower()) for _ in range(outputs)] if isinstance(outputs, int) else outputs
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self._name(op_type), domain=domain, **attrs))
        return outs

    def const(self, value, dtype=np.int64) -> str:
        name = self._name("const")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def _coordinates(self) -> str:
        """The int32 [N, 4] indices (batch, c0, c1, c2) from `coors` (z, y, x), as each writer builds them."""
        if self.variant == "direct":
            return "coors"
        (shape,) = self.node("Shape", ["coors"])
        (rows,) = self.node("Gather", [shape, self.const([0])], axis=0)
        (zeros_shape,) = self.node("Concat", [rows, self.const([1])], axis=0)
        if self.variant == "awml":  # flip to (x, y, z); float zeros, float Concat, Cast to int32
            (flipped,) = self.node("Slice", ["coors", self.const([-1]), self.const([-2 ** 63 + 1]), self.const([1]),
                                             self.const([-1])])
            (zeros,) = self.node("ConstantOfShape", [zeros_shape], value=numpy_helper.from_array(np.zeros(1, np.float32)))
            (flipped_float,) = self.node("Cast", [flipped], to=TensorProto.FLOAT)
            (joined,) = self.node("Concat", [zeros, flipped_float], axis=1)
        else:  # autoware-ml: int zeros, then (b, y, x, z)
            (zeros,) = self.node("ConstantOfShape", [zeros_shape], value=numpy_helper.from_array(np.zeros(1, np.int32)))
            (stacked,) = self.node("Concat", [zeros, "coors"], axis=1)
            (joined,) = self.node("Gather", [stacked, self.const([0, 2, 3, 1])], axis=1)
        return self.node("Cast", [joined], to=TensorProto.INT32)[0]

    def coordinates_of(self, coors: np.ndarray) -> np.ndarray:
        """The (batch, c0, c1, c2) sites of `coors` rows."""
        if self.variant == "direct":
            return coors.astype(np.int64)
        sites = np.zeros((len(coors), 4), np.int64)
        for column, axis in enumerate(COORS[self.variant]):
            sites[:, 1 + axis] = coors[:, column]
        return sites

    def pairs(self, indices: str, grid, kind: str, ksize, stride=1, padding=0, dilation=1, out_padding=0,
              key=None, **extra):
        if key in self.keys:
            return self.keys[key]
        n = 3
        ksize, stride, padding, dilation, out_padding = ((v,) * n if isinstance(v, int) else tuple(v)
                                                         for v in (ksize, stride, padding, dilation, out_padding))
        attrs = dict(batch_size=1, spatial_shape=list(grid), algo=0 if self.native else 1, ksize=list(ksize),
                     stride=list(stride), padding=list(padding), dilation=list(dilation),
                     out_padding=list(out_padding), subm=int(kind == "subm"), transpose=int(kind == "deconv"))
        if not self.native:
            attrs["is_train"] = int(kind != "subm")
        attrs.update(extra)
        outputs = self.node(PAIR_NATIVE if self.native else PAIR_IMPLICIT, [indices], 4 if self.native else 5,
                            domain="autoware", **attrs)
        if kind == "subm":
            out_grid = tuple(grid)
        elif kind == "conv":
            out_grid = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                             for s, k, st, p, d in zip(grid, ksize, stride, padding, dilation))
        else:
            out_grid = tuple((s - 1) * st - 2 * p + d * (k - 1) + op + 1
                             for s, k, st, p, d, op in zip(grid, ksize, stride, padding, dilation, out_padding))
        pair = dict(outputs=outputs, kind=kind, grid=out_grid, geometry=(ksize, stride, padding, dilation))
        if key:
            self.keys[key] = pair
        return pair

    def conv(self, x, pair, cout: int, bias: str = "none", act_type: int | None = None, **attrs):
        """bias "none", "add" (a separate Add, as tier4's writers export it) or "fused" (a 6th input)."""
        features, grid, cin, indices = x
        ksize, stride, padding, dilation = pair["geometry"]
        w = (self.rng.standard_normal((cout, *ksize, cin)) / 3).astype(np.float32)
        b = (self.rng.standard_normal(cout) / 3).astype(np.float32)
        inputs = [features, self.const(w, np.float32), *pair["outputs"][1:4]]
        if bias == "fused":
            inputs.append(self.const(b, np.float32))
        if act_type is not None:
            attrs["act_type"] = act_type
        if self.native:
            (out,) = self.node("IndiceConv", [*inputs[:4], pair["outputs"][3]], domain="autoware",
                               is_subm=int(pair["kind"] == "subm"), **attrs)
        else:
            defaults = dict(act_alpha=0.0, act_beta=0.0, is_subm=int(pair["kind"] == "subm"), is_train=0,
                            output_add_scale=0.0, output_scale=1.0)
            (out,) = self.node("ImplicitGemm", inputs, domain="autoware", **{**defaults, **attrs})
        if bias == "add":
            (out,) = self.node("Add", [out, self.const(b, np.float32)])
        kind = pair["kind"]
        added = b if bias != "none" else np.zeros(cout, np.float32)
        activation = {1: lambda v: np.maximum(v, 0)}.get(act_type)

        def run(env, source=features, out=out):
            if kind == "subm":
                result = spconv_subm(env[source], w, added, dilation)
            elif kind == "conv":
                result = spconv_conv(env[source], w, added, stride, padding, dilation, pair["grid"])
            else:
                result = spconv_deconv_dilated(env[source], w, added, stride, padding, dilation, pair["grid"])
            env[out] = {k: activation(v) for k, v in result.items()} if activation else result
        self.program.append(run)
        return out, pair["grid"], cout, pair["outputs"][0]

    def relu(self, x):
        (out,) = self.node("Relu", [x[0]])
        self.program.append(lambda env, source=x[0]: env.__setitem__(
            out, {k: np.maximum(v, 0) for k, v in env[source].items()}))
        return (out, *x[1:])

    def dense(self, x):
        """AWML's `.dense()` as traced: ScatterND of the rows into zeros [B, c0, c1, c2, C] at out_indices,
        then channels first."""
        features, grid, channels, indices = x
        (zeros,) = self.node("ConstantOfShape", [self.const([1, *grid, channels])],
                             value=numpy_helper.from_array(np.zeros(1, np.float32)))
        (wide,) = self.node("Cast", [indices], to=TensorProto.INT64)
        (scattered,) = self.node("ScatterND", [zeros, wide, features])
        (out,) = self.node("Transpose", [scattered], perm=[0, 4, 1, 2, 3])
        self.program.append(lambda env: env.__setitem__(out, spconv_dense(env[features], 1, channels, grid)))
        return out

    def build(self, *outputs, shapes=None) -> onnx.ModelProto:
        values = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None if shapes is None else shapes[i])
                  for i, o in enumerate(outputs)]
        for value in values:
            value.type.tensor_type.shape.SetInParent()  # a shape of unknown rank: what torch declares for them
        graph = helper.make_graph(self.nodes, "autoware", self.inputs, values, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("autoware", 1)])
        model.ir_version = 8
        self.outputs, self.model = outputs, model
        return model

    def random_input(self, count=80):
        volume = int(np.prod(self.grid))
        sites = self.rng.choice(volume, size=min(count, volume), replace=False)
        spatial = np.column_stack(np.unravel_index(sites, self.grid))
        if self.variant == "direct":
            coors = np.column_stack([np.zeros(len(sites)), spatial]).astype(np.int32)
        else:
            coors = np.zeros((len(sites), 3), np.int32)
            for column, axis in enumerate(COORS[self.variant]):
                coors[:, column] = spatial[:, axis]
        features = self.rng.standard_normal((len(sites), self.x[2])).astype(np.float32)
        return {"voxel_features": features, "coors": coors}

    def evaluate(self, feeds) -> list:
        env = {"voxel_features": as_dict(feeds["voxel_features"], self.coordinates_of(feeds["coors"]))}
        for run in self.program:
            run(env)
        return [env[o] for o in self.outputs]


def spconv_deconv_dilated(x, w, b, stride, padding, dilation, out_shape):
    """A transposed conv whose taps use the dilation (the pair op's rule `c(o) = c(i)·s − p + k·d`)."""
    if all(d == 1 for d in dilation):
        return spconv_deconv(x, w, b, stride, padding, out_shape)
    raise NotImplementedError("dilated transposed convs are not written here")


def encoder(variant: str, rng, bias="add", act_type=None, native=False, grid=(8, 10, 6), cin=4,
            **pair_extra) -> AutowareGraph:
    """BEVFusion's sparse encoder in small (on `grid`): two subm convs sharing a pair op, a strided conv, a
    subm conv with a bias, conv_out (1, 1, 3) stride (1, 1, 2), densified."""
    g = AutowareGraph(variant, grid, cin, rng, native=native)
    p = g.pairs(g.x[3], g.grid, "subm", 3, padding=1, key="subm1", **pair_extra)
    a = g.relu(g.conv(g.x, p, 8))
    b = g.relu(g.conv(a, p, 8, bias=bias, act_type=act_type))
    if native:
        g.build(b[0])
        return g
    down = g.pairs(b[3], b[1], "conv", 3, stride=2, padding=1, **pair_extra)
    c = g.relu(g.conv(b, down, 12))
    p2 = g.pairs(c[3], c[1], "subm", 3, padding=1, key="subm2", **pair_extra)
    d = g.conv(c, p2, 12, bias=bias, act_type=act_type)
    out = g.pairs(d[3], d[1], "conv", (1, 1, 3), stride=(1, 1, 2), **pair_extra)
    g.build(g.dense(g.relu(g.conv(d, out, 6))))
    return g
