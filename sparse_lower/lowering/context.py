"""State shared by the lowering rules during one pass: the graph, the target's policy of which compute
form each conv gets and its index tables, the shared-node cache, the dense sources left by ToSparse, the capacity-padded
versions of feature rows, and the naming of new tensors.

Index tables are cached by (builder op, input tensors, attributes): two layers with the same coords
and geometry read one table, which is spconv's `indice_key` reuse without the user naming keys. The
cache is per pass, never global, and serves the gpu and nna layers of a hybrid model alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..names import UniqueNames
from .graph import through_casts
from ..onnx_conventions import CUSTOM_DOMAIN

INT64 = np.int64
FLOAT = np.float32


@dataclass(frozen=True)
class DenseSource:
    """A sparse tensor that is still a dense `[B, C, *S]` tensor in the graph (a lowered ToSparse)."""

    dense: gs.Tensor
    coords: gs.Tensor


def level_capacity(max_active: int | tuple[int, ...] | None, level: int) -> int | None:
    """The row capacity of a level under `max_active`: the one capacity, or the level's own, the last
    serving deeper levels (None: no capacity)."""
    if not max_active:
        return None
    capacities = (max_active,) if isinstance(max_active, int) else max_active
    return capacities[min(level, len(capacities) - 1)]


@dataclass(frozen=True)
class Options:
    """What the user chose (docs/python_api.md): the gpu compute form, and the nna combine method, capacity,
    whether the nna runs one 1×1 conv per tap or one conv with K·Cout outputs, its layout (the
    `[1, C, 1, N]` image or `[N, C]` rows), the pairs combine's capacities and, with a capacity, the most
    rows a Coalesce merges into one site; the portable static form's batches; whether the nna and hybrid
    tables come from the library or are standard ops; the gpu compute form chosen per conv (tuning.py)."""

    strategy: str = "auto"
    combine: str = "gather"
    max_active: int | tuple[int, ...] | None = None  # one capacity, or one per level (see LoweringContext.level)
    max_batch: int | None = None  # the portable static form's batches (None: the model's ToDense batch_size, else 1)
    fuse_taps: bool = False
    layout: str = "image"
    max_pairs: dict[str, tuple[int, ...]] | None = None  # the pairs combine's pairs per tap, by source conv name
    max_members: int | None = None  # the most rows one site of a Coalesce holds, with a capacity (the static form)
    tables: str = "library"  # "standard": the nna and hybrid tables in standard ops (lowering.index_tables)
    layer_strategies: dict[str, str] | None = None  # the gpu compute form of some convs, by source conv name


class LoweringContext:
    """`compute_for(node)` is the compute form (lowering/compute.py) the target's policy gives a conv;
    `tables` the target's index tables (lowering/index_tables.py)."""

    def __init__(self, graph: gs.Graph, compute_policy: Callable, tables, levels: dict[str, int] | None = None):
        self.graph = graph
        self._policy = compute_policy
        self.tables = tables
        self.dense_sources: dict[str, DenseSource] = {}
        self.padded: dict[str, gs.Tensor] = {}
        self.conv_outputs: set[str] = set()  # feature rows produced by lowered convs (for hybrid)
        self.levels = dict(levels or {})  # coords tensor -> its level (schemas.coords_levels), where not 0
        self._shared: dict[tuple, list[gs.Variable]] = {}
        self._constants: dict[str, gs.Constant] = {}
        self._names = UniqueNames([*graph.tensors(), *(n.name for n in graph.nodes)])

    def compute_for(self, node: gs.Node):
        return self._policy(node, self)

    def after_a_sparse_layer(self, tensor: gs.Tensor, seen: set | None = None) -> bool:
        """Whether `tensor` is computed from the output of an already lowered sparse conv."""
        seen = set() if seen is None else seen
        if tensor.name in self.conv_outputs:
            return True
        if tensor.name in seen or len(tensor.inputs) != 1:
            return False
        seen.add(tensor.name)
        return any(self.after_a_sparse_layer(t, seen) for t in tensor.inputs[0].inputs)

    def level(self, coords: gs.Tensor) -> int:
        """The level of a sparse tensor's sites (schemas.coords_levels), for a capacity per level; coords
        passed through a Cast or an Identity (as importers leave them) are those of their input."""
        return self.levels.get(through_casts(coords, lambda t: t.name in self.levels).name, 0)

    def fresh(self, base: str) -> str:
        """A tensor or node name not used anywhere in the graph yet."""
        return self._names.fresh(base)

    def add(self, op: str, base: str, inputs: list, outputs: list, attrs: dict | None = None,
            domain: str = CUSTOM_DOMAIN) -> list[gs.Variable]:
        """Append a node. `outputs` holds Variables to write, or (suffix, dtype, shape) specs to create."""
        made = [o if isinstance(o, gs.Variable) else
                gs.Variable(self.fresh(f"{base}/{o[0]}"), dtype=o[1], shape=o[2]) for o in outputs]
        self.graph.nodes.append(gs.Node(op, name=self.fresh(f"{base}/{op}"), attrs=attrs or {},
                                        inputs=inputs, outputs=made, domain=domain or None))
        return made

    def standard(self, op: str, base: str, inputs: list, outputs: list, attrs: dict | None = None) -> list[gs.Variable]:
        """Append a node of the standard ONNX domain."""
        return self.add(op, base, inputs, outputs, attrs, domain="")

    def shared_node(self, op: str, base: str, inputs: list, outputs: list, attrs: dict,
              domain: str = CUSTOM_DOMAIN) -> list[gs.Variable]:
        """A node shared with every earlier request for the same op, inputs and attributes (index
        builders, casts): computed once however many layers read it."""
        key = (domain, op, tuple(t.name for t in inputs), tuple(sorted((k, str(v)) for k, v in attrs.items())))
        if key not in self._shared:
            self._shared[key] = self.add(op, base, inputs, outputs, attrs, domain)
        return self._shared[key]

    def constant(self, base: str, value: np.ndarray) -> gs.Constant:
        return gs.Constant(self.fresh(base), np.array(value, order="C"))  # keeps 0-d scalars 0-d

    def shared_constant(self, key: str, value: np.ndarray) -> gs.Constant:
        """One initializer per key for the whole graph (e.g. the axes of every Unsqueeze)."""
        if key not in self._constants:
            self._constants[key] = self.constant(key, value)
        return self._constants[key]

    def float32(self, tensor: gs.Tensor) -> gs.Tensor:
        """The tensor as float32: float16 features are accepted and computed in float32 (docs/source_ops.md)."""
        if tensor.dtype != np.float16:
            return tensor
        (cast,) = self.shared_node("Cast", tensor.name, [tensor], [("float32", FLOAT, tensor.shape)],
                                   {"to": int(onnx.TensorProto.FLOAT)}, domain="")
        return cast
