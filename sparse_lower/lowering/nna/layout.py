"""How the nna form lays out the features it computes on: the patent's image, or plain rows.

* `image`: `[1, C, 1, N]`, one column per active site, and a 1×1 `Conv` per tap: what an accelerator
  built around convolutions expects, and what the patent describes.
* `rows`: `[N, C]`, one row per active site, and a `MatMul` by each tap's `[Cin, Cout]` weight; the
  gather and the scatter work on axis 0 of 2-D tensors. Converters that re-lay 4-D tensors out as NHWC
  (onnx2tf for LiteRT) mistranslate a gather on the image's last axis; a 2-D tensor has no layout to
  change. It also saves the transposes that enter and leave the image, and the scatter matrices'.

A layout only places tensors: NnaCompute decides what is computed, and both give the same numbers.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..context import FLOAT, LoweringContext

LAYOUTS = ("image", "rows")


class ImageLayout:
    name = "image"
    axis = 3  # the axis of the active sites

    def shape(self, channels, sites) -> list:
        return [1, channels, 1, sites]

    def enter(self, ctx: LoweringContext, rows: gs.Tensor, cin: int, columns: int | None) -> gs.Tensor:
        """Rows [N, Cin] as the image [1, Cin, 1, N] the 1×1 convs read (shared by every layer reading them)."""
        (transposed,) = ctx.shared_node("Transpose", rows.name, [rows], [("features_t", FLOAT, [cin, columns])],
                                        {"perm": [1, 0]}, domain="")
        shape = ctx.shared_constant(f"shape_1_{cin}_1_-1", np.array([1, cin, 1, -1]))
        (image,) = ctx.shared_node("Reshape", transposed.name, [transposed, shape],
                                   [("image", FLOAT, self.shape(cin, columns))], {}, domain="")
        return image

    def multiply(self, ctx: LoweringContext, base: str, x: gs.Tensor, weight: np.ndarray, out) -> gs.Tensor:
        """x times a `[Cin, Cout]` weight: a 1×1 Conv."""
        cin, cout = weight.shape
        kernel = ctx.constant(f"{base}/W", np.ascontiguousarray(weight.T).reshape(cout, cin, 1, 1))
        return ctx.standard("Conv", base, [x, kernel], [out], {"kernel_shape": [1, 1]})[0]

    def moved_by_matrix(self, ctx: LoweringContext, base: str, partial: gs.Tensor, matrix: gs.Tensor, out) -> gs.Tensor:
        """The partial [1, Cout, 1, N] through a scatter matrix S_k [M, N]: P_k · S_kᵀ."""
        (transposed,) = ctx.shared_node("Transpose", matrix.name, [matrix], [("S_kT", FLOAT, matrix.shape[::-1])],
                                        {"perm": [1, 0]}, domain="")
        return ctx.standard("MatMul", base, [partial, transposed], [out])[0]

    def site_vector(self, ctx: LoweringContext, vector: gs.Tensor, dtype, sites) -> gs.Tensor:
        """A per-site vector [N] as [1, 1, 1, N], broadcasting over channels."""
        shape = ctx.shared_constant("shape_1_1_1_-1", np.array([1, 1, 1, -1]))
        (image,) = ctx.shared_node("Reshape", vector.name, [vector, shape], [("per_site", dtype, [1, 1, 1, sites])], {},
                                   domain="")
        return image

    def channel_vector(self, values: np.ndarray) -> np.ndarray:
        return values.reshape(1, -1, 1, 1)

    def leave(self, ctx: LoweringContext, base: str, y: gs.Tensor, cout: int, sites, out) -> gs.Tensor:
        """The image [1, Cout, 1, M] as rows [M, Cout]."""
        flat = ctx.standard("Reshape", base, [y, ctx.shared_constant(f"shape_{cout}_-1", np.array([cout, -1]))],
                            [("out_columns", FLOAT, [cout, sites])])[0]
        return ctx.standard("Transpose", base, [flat], [out], {"perm": [1, 0]})[0]


class RowsLayout:
    name = "rows"
    axis = 0

    def shape(self, channels, sites) -> list:
        return [sites, channels]

    def enter(self, ctx: LoweringContext, rows: gs.Tensor, cin: int, columns: int | None) -> gs.Tensor:
        return rows

    def multiply(self, ctx: LoweringContext, base: str, x: gs.Tensor, weight: np.ndarray, out) -> gs.Tensor:
        """x times a `[Cin, Cout]` weight: a MatMul."""
        return ctx.standard("MatMul", base, [x, ctx.constant(f"{base}/W", weight)], [out])[0]

    def moved_by_matrix(self, ctx: LoweringContext, base: str, partial: gs.Tensor, matrix: gs.Tensor, out) -> gs.Tensor:
        """The partial [N, Cout] through a scatter matrix S_k [M, N]: S_k · P_k."""
        return ctx.standard("MatMul", base, [matrix, partial], [out])[0]

    def site_vector(self, ctx: LoweringContext, vector: gs.Tensor, dtype, sites) -> gs.Tensor:
        """A per-site vector [N] as [N, 1], broadcasting over channels."""
        shape = ctx.shared_constant("shape_-1_1", np.array([-1, 1]))
        (column,) = ctx.shared_node("Reshape", f"{vector.name}/rows", [vector, shape], [("per_site", dtype, [sites, 1])], {},
                                    domain="")
        return column

    def channel_vector(self, values: np.ndarray) -> np.ndarray:
        return values.reshape(1, -1)

    def leave(self, ctx: LoweringContext, base: str, y: gs.Tensor, cout: int, sites, out) -> gs.Tensor:
        """Already rows: only a graph tensor that must carry its own name needs a node."""
        return ctx.standard("Identity", base, [y], [out])[0] if isinstance(out, gs.Variable) else y


def layout(name: str) -> ImageLayout | RowsLayout:
    return {"image": ImageLayout, "rows": RowsLayout}[name]()
