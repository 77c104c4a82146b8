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

// nbr [M, taps] for source "rows" of a convolution's outputs (not transposed; a submanifold map is one,
// outputs = inputs), `outputs` at the rows of `ascending` in ascending site order. The outputs of one grid
// line (batch, z, y) read the same input grid lines, so they are taken a grid line at a time (groups
// whose taps span at most 4096 input sites along x; a wider kernel line goes to GatherNeighbours): a
// cursor per kernel line finds each input grid line's sites once per group, they are spread by x into a
// small table, and every output of the group copies its kernel line's slots from there, with no search
// and no branch per tap. Each row of nbr is
// written once, while it is in cache. On the real CenterPoint frame, 2 threads, the backbone's four
// SubmanifoldMaps: 18.8 → 13.8 ms for a cursor step per kernel line and row instead of a search per
// tap; 13.0 → 10.3 ms with a 3³ kernel's sizes as constants; 10.1 → 6.0 ms a grid line at a time (and
// the four StridedMaps 7.7 → 7.0).
void LineNeighbours(const Ort::KernelContext& ctx, const MapGeometry& geometry, const Coords& outputs,
                    const SortedSites& ascending, const IndexedInput& inputs, int64_t* nbr);

}  // namespace sparse_lower
