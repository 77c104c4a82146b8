"""The index tables of the `pairs` combine, built outside the accelerator by the `PairLists` custom op
from the neighbour table `nbr [M, K]`, once per table however many layers read it.

Per tap k:
* `sources_k`: the input row of every output that has a neighbour through tap k (`P_k` of them, in
  output order), then the zero row N: `capacity_k + 1` entries under a capacity (`PairLists` refuses
  more than `capacity_k` pairs at run time, naming the `max_pairs` entry to raise, so nothing is ever
  truncated), `P_k + 1` without one.
* `positions_k [M]`: where output m finds its pair's product among the rows `sources_k` selects: its
  rank among tap k's pairs, or P_k (the first zero row) for none.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..context import INT64, LoweringContext


def pair_lists(ctx: LoweringContext, nbr: gs.Tensor, inputs: gs.Tensor, capacities: tuple[int, ...] | None,
               option: str) -> tuple[list[gs.Tensor], list[gs.Tensor]]:
    """(sources_k, positions_k) for every tap of `nbr`. `inputs` has one row per input row (its count is
    the zero row's index), `capacities` are the pairs each tap holds (None: as many as the frame has),
    `option` what the user raises when a frame has more (the layers sharing a table and capacities
    share one PairLists node: the first of them is named)."""
    taps, outputs = nbr.shape[1], nbr.shape[0]
    attrs = {} if capacities is None else {"capacities": list(capacities)}
    total = sum(c + 1 for c in capacities) if capacities else None
    sources, positions, offsets = ctx.shared_node(
        "PairLists", nbr.name, [nbr, inputs],
        [("sources", INT64, [total]), ("positions", INT64, [taps, outputs]), ("offsets", INT64, [taps + 1])], attrs)
    sources.inputs[0].attrs.setdefault("option", option)  # one node per table and capacities: the first layer names it
    lists, places = [], []
    for k in range(taps):
        if capacities:  # constant bounds: the list has a static length
            start = sum(c + 1 for c in capacities[:k])
            bounds = [ctx.shared_constant(f"bound_{n}", np.array([n], np.int64)) for n in (start, start + capacities[k] + 1)]
        else:
            bounds = [ctx.shared_node("Slice", f"{offsets.name}/{n}", [offsets, *(ctx.shared_constant(f"bound_{b}", np.array([b], np.int64)) for b in (n, n + 1))],
                                      [("bound", INT64, [1])], {}, domain="")[0] for n in (k, k + 1)]
        length = capacities[k] + 1 if capacities else None
        (listed,) = ctx.shared_node("Slice", f"{sources.name}/tap{k}", [sources, *bounds], [("tap_sources", INT64, [length])],
                                    {}, domain="")
        (place,) = ctx.shared_node("Gather", f"{positions.name}/tap{k}", [positions, ctx.shared_constant(f"index_{k}", np.array(k))],
                                   [("tap_positions", INT64, [outputs])], {"axis": 0}, domain="")
        lists.append(listed)
        places.append(place)
    return lists, places
