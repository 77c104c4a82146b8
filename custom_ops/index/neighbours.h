// The steps the map builders share: index the input coordinates, find the outputs they reach, and
// fill the neighbour table of a set of outputs.
#pragma once

#include <cstdint>
#include <vector>

#include "common/coords.h"
#include "common/sorted_sites.h"
#include "index/geometry.h"
#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

// The coordinates an index builder reads, checked (in the grid, batch ≥ 0, no duplicates) and
// sorted by linear site. Both sources check them; only "rows" looks rows up.
struct IndexedInput {
  Coords coords;
  SortedSites sites;
};

// Input `index` of the kernel as the input coordinates of `geometry`.
IndexedInput ReadIndexedInput(const Ort::KernelContext& ctx, size_t index, const MapGeometry& geometry);

// The outputs some input reaches through some tap, and the pairs that reach them, tap by tap.
struct ReachedOutputs {
  // The linear sites in the output grid, sorted and distinct: the rows of a lexicographically sorted
  // out_coords.
  std::vector<int64_t> sites;
  // Per tap k, the output site of every input that reaches one through k, and that input's row. Taken
  // in ascending input order, the sites of one tap ascend too (each axis map is strictly monotone), so a
  // Cursor finds their positions in `sites` (the output rows) in O(1) steps mostly.
  std::vector<std::vector<int64_t>> tap_sites;
  std::vector<std::vector<int64_t>> tap_rows;
};

// Why from the inputs: a strided conv fills few of its M·K (output, tap) slots (15 % on the real frame),
// so walking the inputs finds every pair without a lookup per empty slot, and a merge of K ascending lists
// replaces a sort. On the real frame, 1 thread: StridedMap 35.5 → 21.1 ms (sorted), 44.8 → 30.4 ms
// (as read); TransposedMap 2³ s2 50.7 → 31.3 ms.
ReachedOutputs ReachOutputs(const Ort::KernelContext& ctx, const MapGeometry& geometry, const IndexedInput& inputs);

// nbr [M, K] of the reached outputs for source "rows": -1, then every reaching input's row at (its
// output's row, its tap). Each slot has at most one input, so the fill is the same in any order.
void ScatterNeighbours(const Ort::KernelContext& ctx, const ReachedOutputs& reached, int64_t* nbr);

// nbr [M, taps] for the outputs at the rows of `outputs` (already checked against the output grid),
// output by output: the input row each tap reads (a lookup), or for source "dense" its linear site
// (arithmetic only), or -1. `ascending` lists the output rows in ascending site order: the lookups then
// ascend tap by tap (see SortedSites); null when the rows ascend already. O(M·K): the size of nbr itself.
void GatherNeighbours(const Ort::KernelContext& ctx, const MapGeometry& geometry, const Coords& outputs,
                      const std::vector<int64_t>* ascending, const IndexedInput& inputs, int64_t* nbr);

// nbr [N, taps] of a submanifold conv on rows (outputs = inputs, odd kernel, centred): for every pair of
// sites, tap k reads j from i exactly when tap taps−1−k reads i from j, and the centre tap reads the row
// itself. So only the taps before the centre are looked up, and each hit also fills its mirror slot:
// half the lookups of GatherNeighbours, the same table.
void SubmanifoldNeighbours(const Ort::KernelContext& ctx, const MapGeometry& geometry, const IndexedInput& inputs,
                           int64_t* nbr);

}  // namespace sparse_lower
