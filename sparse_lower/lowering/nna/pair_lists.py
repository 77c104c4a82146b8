"""The index tables of the `pairs` combine, built outside the accelerator from the neighbour table
`nbr [M, K]`, once per table however many layers read it: here by the `PairLists` custom op (the
library's tables, index_tables.CustomOpTables), or in standard ops by standard_tables.py.

* `sources`: one block per tap, in tap order. Tap k's block lists the input row of every output that
  has a neighbour through k (`P_k` of them, in output order), then the zero row N: `capacity_k + 1`
  entries under a capacity (`PairLists` refuses more than `capacity_k` pairs at run time, naming the
  `max_pairs` entry to raise, so nothing is ever truncated), `P_k + 1` without one.
  Each tap's block is sliced out here, on the host: with constant bounds under capacities (its list
  has a static length), else bounds read from `PairLists`' offsets.
* `positions_k [M]`: where output m finds its pair's product within tap k's block: its rank among tap
  k's pairs, or P_k (the first zero row) for none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..context import INT64, LoweringContext


@dataclass(frozen=True)
class PairTables:
    sources: list[gs.Tensor]  # per tap, [capacity_k + 1]
    positions: list[gs.Tensor]  # per tap, [M]
    invalid: gs.Tensor | None = None  # bool [1]: a tap over its capacity, where the tables flag it (standard ops)


def pair_lists(ctx: LoweringContext, nbr: gs.Tensor, inputs: gs.Tensor, capacities: tuple[int, ...] | None,
               option: str) -> PairTables:
    """The tables for every tap of `nbr`. `inputs` has one row per input row (its count is the zero
    row's index), `capacities` are the pairs each tap holds (None: as many as the frame has), `option`
    what the user raises when a frame has more (the layers sharing a table and capacities share one
    PairLists node: the first of them is named)."""
    taps, outputs = nbr.shape[1], nbr.shape[0]
    attrs = {} if capacities is None else {"capacities": list(capacities)}
    total = sum(c + 1 for c in capacities) if capacities else None
    sources, positions, offsets = ctx.shared_node(
        "PairLists", nbr.name, [nbr, inputs],
        [("sources", INT64, [total]), ("positions", INT64, [taps, outputs]), ("offsets", INT64, [taps + 1])], attrs)
    if capacities:  # one node per table and capacities: the first layer reading it names the setting
        sources.inputs[0].attrs.setdefault("option", option)
    places = [ctx.shared_node("Gather", f"{positions.name}/tap{k}",
                              [positions, ctx.shared_constant(f"index_{k}", np.array(k))],
                              [("tap_positions", INT64, [outputs])], {"axis": 0}, domain="")[0] for k in range(taps)]
    lists = [ctx.shared_node("Slice", f"{sources.name}/tap{k}", [sources, *_block(ctx, offsets, capacities, k)],
                             [("tap_sources", INT64, [capacities[k] + 1 if capacities else None])], {}, domain="")[0]
             for k in range(taps)]
    return PairTables(lists, places)


def _block(ctx: LoweringContext, offsets: gs.Tensor, capacities: tuple[int, ...] | None,
           k: int) -> tuple[gs.Tensor, gs.Tensor]:
    def bound(n: int) -> gs.Constant:
        return ctx.shared_constant(f"bound_{n}", np.array([n], np.int64))

    if capacities:
        start = sum(c + 1 for c in capacities[:k])
        return bound(start), bound(start + capacities[k] + 1)
    start, end = (ctx.shared_node("Slice", f"{offsets.name}/{n}", [offsets, bound(n), bound(n + 1)],
                                  [("bound", INT64, [1])], {}, domain="")[0] for n in (k, k + 1))
    return start, end
