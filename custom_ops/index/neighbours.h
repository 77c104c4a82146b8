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

// Rows are filled (and inputs walked) in ascending site order, which for coordinates as a user gives them
// (a voxelizer's order) is a random order of rows: each row's coordinates and its K slots of nbr then miss
// the cache, and one row at a time leaves the memory idle between misses. Asking for row i + this many's
// lines while row i is filled overlaps them. On the real frame as read, 1 thread: TargetMap of the UNet's
// finest inverse conv 18.4 → 13.5 ms, SubmanifoldMap 3³ 31–35 → 25–27 ms; unchanged on sorted coordinates.
constexpr int64_t kPrefetchAhead = 8;

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

// nbr [N, taps] of a submanifold conv on rows (outputs = inputs, odd kernel, centred). The taps that differ
// in the last dimension only (a line: 3 of the 27 of a 3³ kernel) read sites that are neighbours in the
// sorted list, so each line is found by one cursor step and a walk over the few sites it spans, rather
// than by a search per tap. Rows in ascending site order: each line's cursor then ascends. On the real
// CenterPoint frame, 2 threads, the backbone's four maps: 18.8 → 13.8 ms (the earlier half-table-and-
// mirror form searched for half the taps, but each through the generic walk of ForEachInput, and wrote
// the mirror slots in a second pass of scattered writes); with the loop's values held as locals, which
// the stores into nbr cannot alias, and a 3³ kernel's sizes as constants: 13.0 → 10.3 ms.
void SubmanifoldNeighbours(const Ort::KernelContext& ctx, const MapGeometry& geometry, const IndexedInput& inputs,
                           int64_t* nbr);

}  // namespace sparse_lower
