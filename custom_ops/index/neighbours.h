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

// The linear sites in the output grid of every output some input reaches through some tap, sorted and
// distinct: the rows of a lexicographically sorted out_coords.
std::vector<int64_t> ReachedOutputs(const Ort::KernelContext& ctx, const MapGeometry& geometry, const Coords& inputs);

// nbr [M, taps] for the outputs at the rows of `outputs` (already checked against the output grid),
// output by output: the input row each tap reads (a lookup), or for source "dense" its linear site
// (arithmetic only), or -1. `ascending` lists the output rows in ascending site order, or is null when
// the outputs are sorted: the lookups then ascend tap by tap (see SortedSites). O(M·K) for the
// builders' sorted outputs: the size of nbr itself.
void GatherNeighbours(const Ort::KernelContext& ctx, const MapGeometry& geometry, const Coords& outputs,
                      const std::vector<int64_t>* ascending, const IndexedInput& inputs, int64_t* nbr);

}  // namespace sparse_lower
