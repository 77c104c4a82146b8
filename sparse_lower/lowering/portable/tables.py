"""The portable target's index tables, built from standard ops inside the graph: the same output sites
and row order as the library's custom ops (docs/custom_ops.md), and neighbour tables holding 1 + the
row where the custom ops hold the row, 0 where they hold −1 (the compute puts a zero row first).

* SubmanifoldConv and SparseConv: a neighbour sits at `o·s − pb + k·d` in each dimension (s = 1 and
  centred taps for SubmanifoldConv), inside the halo of the input's site grid (grid.py), which
  `grid.lookup` reads per tap.
* SparseDeconv: the neighbour `(o + pb − k·d) / s` exists only where the division is exact; the
  quotients are computed per dimension and clamped into the halo.
* Output sites of SparseConv (the candidates per dimension of taps.reached_by_strided, or under the floor
  rule the one of taps.floored) and SparseDeconv: sites.reached_sites.
* With `max_active`, the static form: every size a constant, padding rows (coords −1) in
  every sparse tensor after the real ones (grid.Fixed).

Every table and output coords tensor made here carries the flag of the coords it was made from
(`invalid`), which the compute form (compute.py) turns into NaN outputs.
"""

from __future__ import annotations

from math import prod

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...errors import SparseLowerError
from ...onnx_conventions import SOURCE_DOMAIN
from ...schemas import CONV_OPS, ConvGeometry, conv_geometry
from ..context import INT64, LoweringContext, level_capacity
from ..graph import through_casts
from ..nna.padding import ROWWISE
from ..nna.sites import row_count
from .boundary import dense_from_rows, rows_from_dense
from .emit import BOOL, Emit
from .grid import MAX_GRID_BYTES, Fixed, SiteGrid, build_grid, column_volume, grid_bytes, lookup, numbers_like
from .sites import reached_sites
from .taps import exact_quotients, floored, per_dimension, reached_by_strided


def _halo(geometry: ConvGeometry) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """How far outside its input grid a conv's neighbours lie, before and after each dimension."""
    n = geometry.ndim
    if geometry.centred:
        half = tuple((k - 1) // 2 * d for k, d in zip(geometry.kernel_shape, geometry.dilations))
        return half, half
    if geometry.op_type in ("SparseConv", "SparseMaxPool"):  # o·s − pb + k·d lies in [−pb, S − 1 + pe]
        return geometry.pads[:n], geometry.pads[n:]
    return (1,) * n, (1,) * n  # transposed: quotients are clamped to [−1, S]


def grid_halos(graph: onnx.GraphProto) -> dict[tuple, tuple[tuple, tuple]]:
    """The halo of the site grids of each input extent: the widest any conv of the model reading that
    extent needs, so that all the layers on one coords tensor share one grid."""
    halos: dict[tuple, tuple[tuple, tuple]] = {}
    for node in graph.node:
        if node.domain != SOURCE_DOMAIN or node.op_type not in (*CONV_OPS, "SparseMaxPool"):
            continue
        geometry = conv_geometry(node)
        low, high = _halo(geometry)
        known_low, known_high = halos.get(geometry.spatial_shape, (low, high))
        halos[geometry.spatial_shape] = (tuple(map(max, low, known_low)), tuple(map(max, high, known_high)))
    return halos


class StandardOpTables:
    """Index tables in standard ops (the module docstring). `halos`: grid_halos of the source model;
    `max_active` (one capacity, or one per level) and `batches`: the static form, whose every tensor has a
    fixed size (grid.Fixed)."""

    def __init__(self, halos: dict[tuple, tuple[tuple, tuple]], max_active: int | tuple[int, ...] | None = None,
                 batches: int = 1):
        self.halos = halos
        self.max_active = max_active
        self.batches = batches
        self._grids: dict[tuple, SiteGrid] = {}
        self._tables: dict[tuple, tuple] = {}
        self._made: dict[str, gs.Tensor | None] = {}  # coords and tables made here -> their flag

    def invalid(self, tensor: gs.Tensor) -> gs.Tensor | None:
        """The flag (bool [1]) of a table or coords made here: whether the frame broke a rule of sparse
        tensors; None where nothing can be wrong."""
        return self._made.get(tensor.name)

    def made(self, tensor: gs.Tensor, flag: gs.Tensor | None) -> None:
        """Record coords made by the lowering (unique, inside their grid) with the flag they inherit."""
        self._made[tensor.name] = flag

    def fixed(self, level: int) -> Fixed | None:
        """The static form's sizes at a level (None: the dynamic form)."""
        rows = level_capacity(self.max_active, level)
        return None if rows is None else Fixed(rows, self.batches)

    def grid(self, ctx: LoweringContext, base: str, coords: gs.Tensor, extents: tuple,
             low: tuple | None = None, high: tuple | None = None) -> SiteGrid:
        """The site grid of `coords` in a grid of `extents`: in the dynamic form spanning the frame's rows
        (grid.py), in the static form the whole grid with at least the halo asked for, refused (naming the
        node `base`) where one batch of it would take more than MAX_GRID_BYTES."""
        fixed = self.fixed(ctx.level(coords))
        zeros = (0,) * len(extents)
        known_low, known_high = self.halos.get(extents, (zeros, zeros)) if fixed else (zeros, zeros)
        low = tuple(map(max, known_low, low or zeros)) if fixed else zeros
        high = tuple(map(max, known_high, high or zeros)) if fixed else zeros
        key = (coords.name, extents, low, high)
        if key not in self._grids:
            checked = coords.name not in self._made
            if fixed:
                _within_limit(base, f"site grid of {list(extents)} (with its halo {list(low)}, {list(high)})",
                              grid_bytes(extents, low, high))
                _within_counting(base, "site grid's columns", fixed.batches * column_volume(extents, low, high))
                if checked:
                    fix_rows(ctx, coords, fixed.rows)
            e = Emit(ctx, f"{coords.name}/grid")
            inherited = self._made.get(coords.name) if not checked else e.either(*self._upstream_flags(coords))
            self._grids[key] = build_grid(e, coords, extents, low, high, checked, inherited, fixed)
        return self._grids[key]

    def _upstream_flags(self, tensor: gs.Tensor) -> list[gs.Tensor]:
        """The flags of the coords made here from which standard ops computed `tensor` (an export's rows cut
        to the frame's extent, a level moved onto a finer grid): a frame flagged there (a grid over the limit,
        a level over its capacity) stays flagged through them."""
        flags, seen, pending = [], set(), [tensor]
        while pending:
            value = pending.pop()
            if value.name in seen:
                continue
            seen.add(value.name)
            if value.name in self._made:
                if self._made[value.name] is not None:
                    flags.append(self._made[value.name])
                continue
            pending.extend(t for node in value.inputs for t in node.inputs)
        return flags

    def _shared(self, key: tuple, build):
        if key not in self._tables:
            self._tables[key] = build()
        return self._tables[key]

    def _input(self, ctx, base, geometry, coords) -> tuple[Emit, SiteGrid]:
        """The emitter of a conv's table, and the site grid of its input with the halo its taps reach."""
        low, high = _halo(geometry)
        return Emit(ctx, base), self.grid(ctx, base, coords, geometry.spatial_shape, low, high)

    def _output_sites(self, e, grid, geometry, coords, positions, reachable, counts, level: int):
        """The sorted output coords of a strided or transposed conv (sites.reached_sites), made here, at
        `level` (their capacity in the static form)."""
        fixed = self.fixed(level)
        if fixed:
            _within_limit(e.base, f"output marks of {list(geometry.output_shape)}", marks_bytes(geometry))
            _within_counting(e.base, "output marks", fixed.batches * prod(geometry.output_shape))
        out_coords, overflow = reached_sites(e, grid, coords, positions, reachable, counts, geometry.output_shape,
                                             fixed.rows if fixed else None)
        self.made(out_coords, e.either(grid.invalid, overflow))
        return out_coords

    def _real_rows(self, e, out_coords) -> gs.Tensor | None:
        """The rows of new coords that are not padding (the static form's), None where all are."""
        if not self.max_active:
            return None
        return e("GreaterOrEqual", e.column(out_coords, 0), e.const(0), dtype=BOOL, shape=[None], name="real")

    def submanifold_map(self, ctx, base, geometry, coords, source):
        def build():
            e, grid = self._input(ctx, base, geometry, coords)
            positions = [per_dimension(e, coords, dim, 1, (np.arange(size) - (size - 1) // 2) * dilation)
                         for dim, (size, dilation) in enumerate(zip(geometry.kernel_shape, geometry.dilations))]
            nbr = lookup(e, grid, e.column(coords, 0), positions, geometry.kernel_shape, grid.inside)
            self.made(nbr, grid.invalid)
            return nbr
        return self._shared((coords.name, geometry), build)

    def strided_map(self, ctx, base, geometry, coords, source):
        def build():
            e, grid = self._input(ctx, base, geometry, coords)
            dims = list(zip(geometry.kernel_shape, geometry.strides, geometry.dilations, geometry.pads))
            if geometry.floor:  # one candidate per row and dimension, always inside the output grid
                candidates = [(floored(e, coords, dim, stride), None) for dim, stride in enumerate(geometry.strides)]
                counts = [1] * geometry.ndim
            else:
                candidates = [reached_by_strided(e, coords, dim, size, stride, dilation, pad, extent)
                              for dim, ((size, stride, dilation, pad), extent) in
                              enumerate(zip(dims, geometry.output_shape))]
                counts = [(size - 1) * dilation // stride + 1 for size, stride, dilation, _ in dims]
            out_coords = self._output_sites(e, grid, geometry, coords, [p for p, _ in candidates],
                                            [r for _, r in candidates], counts, ctx.level(coords) + 1)
            neighbours = [per_dimension(e, out_coords, dim, stride, np.arange(size) * dilation - pad)
                          for dim, (size, stride, dilation, pad) in enumerate(dims)]  # o·s − pb + k·d, in the halo
            nbr = lookup(e, grid, e.column(out_coords, 0), neighbours, geometry.kernel_shape,
                         self._real_rows(e, out_coords))
            self.made(nbr, self.invalid(out_coords))
            return out_coords, nbr
        return self._shared((coords.name, geometry), build)

    def transposed_map(self, ctx, base, geometry, coords, source):
        def build():
            e, grid = self._input(ctx, base, geometry, coords)
            positions = [per_dimension(e, coords, dim, stride, np.arange(size) * dilation - pad)
                         for dim, (size, stride, dilation, pad) in enumerate(zip(
                             geometry.kernel_shape, geometry.strides, geometry.dilations, geometry.pads))]
            out_coords = self._output_sites(e, grid, geometry, coords, positions, [None] * geometry.ndim,
                                            geometry.kernel_shape, max(ctx.level(coords) - 1, 0))
            nbr = lookup(e, grid, e.column(out_coords, 0), _divided_positions(e, geometry, out_coords),
                         geometry.kernel_shape, self._real_rows(e, out_coords))
            self.made(nbr, self.invalid(out_coords))
            return out_coords, nbr
        return self._shared((coords.name, geometry), build)

    def target_map(self, ctx, base, geometry, coords, targets, source):
        def build():
            e, grid = self._input(ctx, base, geometry, coords)
            flag = self.invalid(targets) if targets.name in self._made else \
                self.grid(ctx, base, targets, geometry.output_shape).invalid  # the targets checked as coords
            batch = e.column(targets, 0)  # a target may lie in a batch the input has no row in
            known = e("And", e("GreaterOrEqual", batch, e.const(0), dtype=BOOL, shape=[None]),
                      e("Less", batch, grid.batches, dtype=BOOL, shape=[None]), dtype=BOOL, shape=[None])
            nbr = lookup(e, grid, batch, _divided_positions(e, geometry, targets), geometry.kernel_shape, known)
            self.made(nbr, e.either(grid.invalid, flag))
            return nbr
        return self._shared((coords.name, targets.name, geometry), build)

    first_row = 1

    def paired_rows(self, ctx, base, features, coords, table):
        """Rows the user fed that do not pair with their coords flag the frame, with the table's own flag."""
        e = Emit(ctx, base)
        invalid = self.invalid(table)
        if not ctx.after_a_sparse_layer(features):
            paired = e("Equal", e.rows(features), e.rows(coords), dtype=BOOL, shape=[1], name="paired")
            invalid = e.either(invalid, e("Not", paired, dtype=BOOL, shape=[1], name="unpaired"))
        return features, invalid

    def coalesce_map(self, ctx, base, spatial_shape, coords, width):
        """`Unique` of the rows' linear keys gives the distinct sites, sorted, and each row's site; a
        second `Unique`, of site · (N + 1) + 1 + row, lists the rows site by site (`order`), and site m's
        rows are order[starts[m] + r] for r < counts[m]: the `[M, R]` table holds `1 + row` there, 0 after.
        A row outside the grid (or of negative batch) flags the frame, and so does a site of more rows
        than `width` where it is given (the nna target's fixed R, whose table cuts them)."""
        def build():
            e = Emit(ctx, base)
            batch = e.column(coords, 0)
            keys, outside = batch, e("Less", batch, e.const(0), dtype=BOOL, shape=[None], name="negative")
            for dim, extent in enumerate(spatial_shape):
                column = e.column(coords, 1 + dim)
                wrong = e("Or", e("Less", column, e.const(0), dtype=BOOL, shape=[None]),
                          e("GreaterOrEqual", column, e.const(extent), dtype=BOOL, shape=[None]), dtype=BOOL,
                          shape=[None], name="outside")
                outside = e("Or", outside, wrong, dtype=BOOL, shape=[None], name="outside")
                keys = e("Add", e("Mul", keys, e.const(extent), shape=[None]), column, shape=[None], name="keys")
            unique = ctx.standard("Unique", base, [keys], [("sites", INT64, [None]), ("first", INT64, [None]),
                                                          ("site_of_row", INT64, [None]), ("counts", INT64, [None])],
                                  {"sorted": 1})
            sites, _, site_of_row, counts = unique
            columns, rest = [], sites
            for extent in reversed(spatial_shape):
                columns.append(e("Mod", rest, e.const(extent), shape=[None], name="coordinate"))
                rest = e("Div", rest, e.const(extent), shape=[None], name="rest")
            parts = [e("Unsqueeze", c, e.const([1]), shape=[None, 1], name="column") for c in [rest, *reversed(columns)]]
            out_coords = e("Concat", *parts, shape=[None, 1 + len(spatial_shape)], name="out_coords", axis=1)
            # site · (N + 1) + (1 + row), all distinct: their sorted Unique lists the rows site by site (an
            # argsort without TopK, whose run-time k TVM's importer refuses); what remains of the division is
            # 1 + row, the table's own numbering
            wide = e("Add", e.rows(coords), e.const([1]), shape=[1], name="rows_and_one")
            numbers = e.cast(numbers_like(e, site_of_row), INT64, shape=[None])
            ordered = ctx.standard("Unique", base, [e("Add", e("Mul", site_of_row, wide, shape=[None]), numbers,
                                                      shape=[None], name="site_and_row")],
                                   [("ordered", INT64, [None])], {"sorted": 1})[0]
            order = e("Mod", ordered, wide, shape=[None], name="one_based")
            # members[m, r] = order[starts[m] + r] where r < counts[m], else 0: broadcast arithmetic and one
            # Gather (no scatter into a run-time shape, which TVM's importer cannot reshape)
            starts = e("CumSum", counts, e.const(0), shape=[None], name="starts", exclusive=1)
            if width is None:
                fullest = e("ReduceMax", e("Concat", counts, e.const([1]), shape=[None], axis=0), shape=[1],
                            name="fullest", keepdims=1, **({} if (ctx.graph.opset or 0) >= 18 else {"axes": [0]}))
                fullest = e("Squeeze", fullest, e.const([0]), shape=[])
            slots = e("Range", e.const(0), fullest if width is None else e.const(width), e.const(1), shape=[width],
                      name="slots")
            as_column = lambda t: e("Unsqueeze", t, e.const([1]), shape=[None, 1])  # noqa: E731
            cells = e("Add", as_column(starts), slots, shape=[None, None], name="cells")
            last = e("Sub", e.rows(coords), e.const([1]), shape=[1], name="last")
            found = e.gather_like(order, e("Max", e("Min", cells, last, shape=[None, None]), e.const(0),
                                           shape=[None, None]), INT64, [None, None], name="found")
            filled = e("Less", slots, as_column(counts), dtype=BOOL, shape=[None, None], name="filled")
            members = e("Where", filled, found, e.const(0), shape=[None, width], name="members")
            crowded = None if width is None else e.any(e("Greater", counts, e.const(width), dtype=BOOL, shape=[None]))
            flag = e.either(self.invalid(coords), e.any(outside), crowded)
            self.made(out_coords, flag)
            self.made(members, flag)
            return out_coords, members
        return self._shared((coords.name, "coalesce", spatial_shape, width), build)

    def flag_overflow(self, ctx, invalid, *rows):
        """`invalid`, or a tensor of more rows than its capacity: the nna form's standard pads cut such rows
        (nna/standard_tables.py), and standard ops cannot refuse the frame."""
        e = Emit(ctx, "capacity")
        over = [ctx.shared_node("Less", f"{tensor.name}/capacity", [e.const([capacity]), row_count(ctx, tensor)],
                                [("over", BOOL, [1])], {}, domain="")[0] for tensor, capacity in rows if capacity]
        return e.either(invalid, *over)

    def to_sparse(self, ctx, base, dense, features, coords):
        fixed = self.fixed(0)
        if fixed and dense.shape:
            _within_counting(base, "ToSparse's marks", prod(d if isinstance(d, int) else 0 for d in dense.shape))
        overflow = rows_from_dense(Emit(ctx, base), dense, features, coords, fixed.rows if fixed else None)
        self.made(coords, overflow)

    def to_dense(self, ctx, base, features, coords, boundary, output):
        flag = self.invalid(coords) if coords.name in self._made else \
            self.grid(ctx, base, coords, boundary.spatial_shape).invalid  # the user's coords: checked
        dense_from_rows(Emit(ctx, base), features, coords, boundary, flag, output, padded=bool(self.max_active))


def _within_limit(base: str, what: str, size: int) -> None:
    """Refuse (naming the node `base`) a static-form index tensor of more than MAX_GRID_BYTES per batch."""
    if size > MAX_GRID_BYTES:
        raise SparseLowerError(f"the portable target's static {what} takes up to {size / 2**30:.1f} GiB per batch, "
                               f"over the limit of {MAX_GRID_BYTES / 2**30:.0f} GiB", base,
                               "leave out max_active (the dynamic form's grids follow the frame), lower for the gpu "
                               "or nna target, whose index tables grow with the active sites, or write the model on "
                               "a tighter grid (sparse_lower.export's max_spatial_shape)")


COUNTING_LIMIT = 2**24  # float32 counts every integer up to here: the static form's CumSum of marks


def _within_counting(base: str, what: str, cells: int) -> None:
    """Refuse (naming the node `base`) the static form where marks that a float32 CumSum numbers would have
    more cells than it counts exactly."""
    if cells >= COUNTING_LIMIT:
        raise SparseLowerError(f"the static form's {what} have {cells:,} cells, more than the 2^24 its float32 "
                               f"count numbers exactly", base,
                               "leave out max_active (row counts then follow the frame), or crop the grid")


def fix_rows(ctx: LoweringContext, tensor: gs.Tensor, rows: int) -> None:
    """Declare a graph input's row count as the static form's capacity: the model then takes frames of
    exactly that many rows, the last ones padding (coords −1). A Cast or Identity between the input and
    the sparse layer (as importers leave them) is looked through."""
    tensor = through_casts(tensor, lambda t: t in ctx.graph.inputs)
    if tensor in ctx.graph.inputs and tensor.shape:
        tensor.shape = [rows, *tensor.shape[1:]]


def padding_reader(graph: onnx.GraphProto) -> tuple[onnx.NodeProto, str] | None:
    """(node, tensor): the first node other than a source op or a row-wise op that reads the rows of a
    sparse layer's output: in the static form it would take the padding rows (coords −1) for sites.
    Casts and Identities are looked through; graph outputs are the user's, who drops the padding."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    pending = [(name, is_coords) for n in graph.node if n.domain == SOURCE_DOMAIN and n.op_type in CONV_OPS
               for name, is_coords in zip(n.output, (False, True))]  # (features, coords) of every conv
    seen = set()
    while pending:
        name, is_coords = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in readers.get(name, []):
            if node.domain == SOURCE_DOMAIN:
                continue
            if node.op_type not in ("Cast", "Identity") and (is_coords or node.op_type not in ROWWISE):
                return node, name
            pending.extend((out, is_coords) for out in node.output)
    return None


def marks_bytes(geometry: ConvGeometry) -> int:
    """The bytes per batch of the marks that find a strided or transposed conv's output sites."""
    return 4 * prod(geometry.output_shape)


def index_memory(graph: onnx.GraphProto) -> list[tuple[str, tuple, int]]:
    """(what, extent, most bytes per batch) of every index tensor the portable lowering of `graph` makes
    whose size follows the grid, not the active sites: a site grid per input extent, and the marks of
    each strided or transposed conv's output grid (`sparse-lower inspect` prints them)."""
    found = [(f"site grid (halo {list(low)}, {list(high)})", extent, grid_bytes(extent, low, high))
             for extent, (low, high) in grid_halos(graph).items()]
    for node in graph.node:
        if node.domain == SOURCE_DOMAIN and node.op_type in ("SparseConv", "SparseDeconv") and \
                not (len(node.input) > 4 and node.input[4]):
            geometry = conv_geometry(node)
            found.append((f"output marks of {node.name}", geometry.output_shape, marks_bytes(geometry)))
    return found


def _divided_positions(e: Emit, geometry: ConvGeometry, out_coords: gs.Tensor) -> list[gs.Variable]:
    """Per dimension, [M, K_i]: the input position `(o + pb − k·d) / s` a transposed conv's output o
    reads through tap index k, where the division is exact, else −1; clamped into a halo of 1 (whose
    cells hold no row)."""
    n = geometry.ndim
    positions = []
    for dim, (size, stride, dilation, pad, extent) in enumerate(zip(
            geometry.kernel_shape, geometry.strides, geometry.dilations, geometry.pads[:n], geometry.spatial_shape)):
        quotients, exact = exact_quotients(e, per_dimension(e, out_coords, dim, 1, pad - np.arange(size) * dilation),
                                           stride)
        if exact is not None:
            quotients = e("Where", exact, quotients, e.const(-1))
        positions.append(e("Max", e("Min", quotients, e.const(extent)), e.const(-1), name="positions"))
    return positions
