"""SortFirstSites: the gpu target's full-resolution level computed in site order, its rows put back into
the frame's order only where the graph returns them.

Why: a frame's rows come in its sensor's scan order, and the first level keeps the order of its input
(every output of a submanifold conv is the row of its input site). The neighbours of consecutive rows
then lie anywhere in that level's features, and each conv gathers them from all over memory: on the
real CenterPoint frame the 16-channel convs of the first level took 1.6–1.8× their time on the same
rows in site order (docs/performance.md). The strided levels below come out of their maps sorted, so
one sort at the input is all it takes. `SiteOrder` (docs/custom_ops.md) gives the coords in site order,
which row each is and each row's place, the last two as one-tap tables: an `IndexedUnfold` through the
order takes the features into site order, and one through the rank takes every output of the level
that the graph returns back to the frame's order. A row's sums are the same whatever the
rows' order (each tap of a row is added in its fixed order), so the outputs are bitwise those of the
model without the pass.

Where it applies, all of it or nothing: a coords input of the graph read by index builders of rows
(source "rows"), at least one `SubmanifoldMap` among them, and the pairing input of `IndexedConv`s; one
features input of the graph read by those convs, and by nothing else (its gather into site order checks
that it pairs with the coords, as the convs did); every tensor in the level's row order (those features, the outputs of
convs over a table whose rows are the level's) read only as the rows or the residual of an `IndexedConv`
over a table of the level, by a row-wise standard op (a `Relu`, an `Add` of two such tensors or of a
per-channel constant: its output is in the level's order too), as the rows of a dense `IndexedFold` at
the `SiteIndex` of those coords, or returned by the graph; and the rows paired with the level's own (a
conv's rows at its pairing coords, its residual where its output rows are the level's, the rows a fold
writes at the level's sites) in that order themselves. The coords may be returned through an
`Identity`, which keeps reading them as they came.
Anything else (an unfold, a rulebook, any other op on the rows) leaves the model as it was.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..errors import SparseLowerError
from ..lowering.graph import constant_value, deep_graph, model_like
from ..lowering.nna.padding import ROWWISE, broadcasts_over_rows
from ..onnx_conventions import CUSTOM_DOMAIN, is_standard

CONV_ROWS, CONV_TABLE, CONV_COORDS, CONV_RESIDUAL = 0, 1, 4, 5  # IndexedConv's inputs X, idx, coords, R
# The builders whose table rows are the level's own rows (input position of those coords), and those
# whose table values are rows of the level.
SAME_ROWS = {("SubmanifoldMap", 0), ("TargetMap", 1)}
ROWS_READ = {("SubmanifoldMap", 0), ("StridedMap", 0), ("TransposedMap", 0), ("TargetMap", 0)}


class _Level:
    """The tensors of one coords input's level, and whether the rewrite understands every use of them."""

    def __init__(self, graph: gs.Graph, coords: gs.Variable):
        self.coords = coords
        self.same_rows: set[str] = set()  # tables whose rows are the level's rows
        self.rows_read: set[str] = set()  # tables whose values are rows of the level
        self.sites: set[str] = set()  # SiteIndex outputs of the level's coords
        self.ordered: set[str] = set()  # row tensors in the level's order
        self.features: list[gs.Variable] = []  # graph inputs among them (the rewrite takes one)
        self.kept: list[gs.Node] = []  # Identity nodes that return the coords as they came
        self.spatial_shape: list[int] | None = None
        self.valid = self._read_builders(graph) and self._follow_rows(graph)

    def _read_builders(self, graph: gs.Graph) -> bool:
        for node in self.coords.outputs:
            if node.op == "Identity" and is_standard(node.domain) and \
                    all(o in graph.outputs and not o.outputs for o in node.outputs):
                self.kept.append(node)
                continue
            if node.domain != CUSTOM_DOMAIN:
                return False
            at = [i for i, t in enumerate(node.inputs) if t is self.coords]
            for position in at:
                key = (node.op, position)
                if key in SAME_ROWS or key in ROWS_READ:
                    if node.attrs.get("source", "rows") != "rows":
                        return False
                    table = node.outputs[-1].name
                    if key in SAME_ROWS:
                        self.same_rows.add(table)
                    if key in ROWS_READ:
                        self.rows_read.add(table)
                    if node.op == "SubmanifoldMap":
                        self.spatial_shape = list(node.attrs["spatial_shape"])
                elif node.op == "SiteIndex":
                    self.sites.add(node.outputs[0].name)
                elif node.op == "IndexedConv" and position == CONV_COORDS:
                    rows = node.inputs[CONV_ROWS]
                    if isinstance(rows, gs.Variable) and not rows.inputs and rows in graph.inputs:
                        if rows not in self.features:
                            self.features.append(rows)
                else:
                    return False
        return self.spatial_shape is not None and len(self.features) == 1

    def _follow_rows(self, graph: gs.Graph) -> bool:
        self.ordered = {f.name for f in self.features}
        for node in graph.nodes:  # topologically sorted
            if node.op == "IndexedConv" and node.domain == CUSTOM_DOMAIN and \
                    node.inputs[CONV_TABLE].name in self.same_rows:
                self.ordered.update(o.name for o in node.outputs)
            elif self._rowwise(node):
                self.ordered.update(o.name for o in node.outputs)
        if any(f in graph.outputs for f in self.features):
            return False
        for node in graph.nodes:
            if not self._rows_in_order(node):
                return False
            for tensor in node.inputs:
                if tensor.name in self.ordered and not self._reads_rows(node, tensor.name):
                    return False
                if tensor.name in self.same_rows | self.rows_read and not self._reads_table(node, tensor.name):
                    return False
        return not any(o.name in self.same_rows | self.rows_read | self.sites for o in graph.outputs)

    def _rows_in_order(self, node: gs.Node) -> bool:
        """Whether the rows that `node` pairs with the level's own rows are in the level's order too: an
        IndexedConv's input rows where it pairs them with the coords, its residual where its output rows
        are the level's, and the rows a dense IndexedFold writes at the level's sites."""
        if node.domain != CUSTOM_DOMAIN:
            return not any(t.name in self.sites for t in node.inputs)
        inputs = [t.name for t in node.inputs]
        paired = []
        if node.op == "IndexedConv" and len(inputs) > CONV_COORDS and node.inputs[CONV_COORDS] is self.coords:
            paired.append(inputs[CONV_ROWS])
        if node.op == "IndexedConv" and inputs[CONV_TABLE] in self.same_rows and len(inputs) > CONV_RESIDUAL:
            paired.append(inputs[CONV_RESIDUAL])
        for position, name in enumerate(inputs):
            if name in self.sites:
                if node.op != "IndexedFold" or position != 1 or node.attrs.get("mode") != "dense":
                    return False
                paired.append(inputs[0])
        return all(not name or name in self.ordered for name in paired)

    def _rowwise(self, node: gs.Node) -> bool:
        """Whether `node` is a row-wise standard op of level-ordered rows (with constants that broadcast
        over the rows): its outputs are in the level's order too."""
        if not is_standard(node.domain) or node.op not in ROWWISE:
            return False
        values = [constant_value(t) for t in node.inputs]
        ordered = [t.name in self.ordered for t in node.inputs]
        return any(ordered) and all(o or (v is not None and broadcasts_over_rows(v)) for o, v in zip(ordered, values))

    def _reads_rows(self, node: gs.Node, name: str) -> bool:
        """Whether every use of the level-ordered `name` by `node` is one the rewrite keeps consistent."""
        if self._rowwise(node):
            return True
        if node.domain != CUSTOM_DOMAIN:
            return False
        for position, tensor in enumerate(node.inputs):
            if tensor.name != name:
                continue
            if node.op == "IndexedConv":
                table = node.inputs[CONV_TABLE].name
                if position == CONV_ROWS and table in self.rows_read:
                    continue
                if position == CONV_RESIDUAL and table in self.same_rows:
                    continue
            if node.op == "IndexedFold" and position == 0 and node.attrs.get("mode") == "dense" and \
                    node.inputs[1].name in self.sites:
                continue
            return False
        return True

    def _reads_table(self, node: gs.Node, name: str) -> bool:
        """Whether `node` reads the table `name` as an IndexedConv's table with the level's rows."""
        return node.op == "IndexedConv" and node.domain == CUSTOM_DOMAIN and \
            all(position == CONV_TABLE for position, t in enumerate(node.inputs) if t.name == name) and \
            (name not in self.rows_read or node.inputs[CONV_ROWS].name in self.ordered)


def _unfold(graph: gs.Graph, inputs: list[gs.Variable], name: str, output: gs.Variable) -> None:
    """output = rows through a one-tap table (IndexedUnfold: the library's parallel gather; given the coords
    too, it refuses rows that do not pair with them)."""
    graph.nodes.append(gs.Node("IndexedUnfold", name, inputs=inputs, outputs=[output], domain=CUSTOM_DOMAIN))


def _sort(graph: gs.Graph, level: _Level) -> None:
    """The rewrite of one level: its coords and features taken into site order at the input, each
    level-ordered graph output taken back by the rank."""
    coords = level.coords
    prefix = f"{coords.name}/site_order"
    rows = coords.shape[0] if coords.shape else None
    in_order = gs.Variable(f"{coords.name}/in_site_order", dtype=np.int64, shape=coords.shape)
    order = gs.Variable(f"{prefix}/order", dtype=np.int64, shape=[rows, 1])
    rank = gs.Variable(f"{prefix}/rank", dtype=np.int64, shape=[rows, 1])
    (features,) = level.features
    readers = [n for n in coords.outputs if n not in level.kept]
    graph.nodes.append(gs.Node("SiteOrder", f"{prefix}/SiteOrder", {"spatial_shape": level.spatial_shape},
                               inputs=[coords], outputs=[in_order, order, rank], domain=CUSTOM_DOMAIN))
    for reader in readers:
        reader.inputs = [in_order if t is coords else t for t in reader.inputs]
    gathered = gs.Variable(f"{features.name}/in_site_order", dtype=features.dtype, shape=features.shape)
    readers = list(features.outputs)
    _unfold(graph, [features, order, in_order], f"{prefix}/{features.name}", gathered)
    for reader in readers:
        reader.inputs = [gathered if t is features else t for t in reader.inputs]
    for output in graph.outputs:
        if output.name not in level.ordered:
            continue
        sorted_rows = gs.Variable(f"{output.name}/in_site_order", dtype=output.dtype, shape=output.shape)
        (producer,) = output.inputs
        readers = list(output.outputs)
        producer.outputs = [sorted_rows if t is output else t for t in producer.outputs]
        for reader in readers:
            reader.inputs = [sorted_rows if t is output else t for t in reader.inputs]
        _unfold(graph, [sorted_rows, rank], f"{prefix}/back_{output.name}", output)


class SortFirstSites:
    """requires: a lowered model (one without a level of the gpu target's index builders is left as it
    is). ensures: each coords input that was put in site order is read
    by its SiteOrder alone."""

    name = "sort-first-sites"
    step = "putting the full-resolution level's rows in site order"

    def requires(self, model: onnx.ModelProto) -> None:
        """Any model: a level whose uses are not all understood is left as it is."""

    def call(self, model: onnx.ModelProto) -> onnx.ModelProto:
        graph = gs.import_onnx(model)
        levels = [_Level(graph, t) for t in graph.inputs if t.dtype == np.int64 and t.shape is not None
                  and len(t.shape) == 2]
        levels = [level for level in levels if level.valid]
        if not levels:
            return model
        for level in levels:
            _sort(graph, level)
        with deep_graph(graph):
            graph.cleanup().toposort()
        return model_like(graph, model)

    def ensures(self, model: onnx.ModelProto) -> None:
        orders = [n for n in model.graph.node if n.op_type == "SiteOrder" and n.domain == CUSTOM_DOMAIN]
        for order in orders:
            readers = [n for n in model.graph.node if order.input[0] in n.input and n.op_type != "Identity"]
            if readers != [order]:
                raise SparseLowerError(f"coords '{order.input[0]}' are read around their site order", order.name)
