// Entries of an index grouped by target: what lets a fold accumulate in parallel without races.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

// Group g gathers every p with idx[p] == target[g], in ascending p, as entry[start[g] .. start[g + 1]).
// Targets ascend. One task per group then sums in a fixed order: no race, and the result does not
// depend on the number of threads.
struct Groups {
  std::vector<int64_t> target;
  std::vector<int64_t> start;
  std::vector<int64_t> entry;
};

// Groups the `count` entries of idx by target; each must lie in [0, targets) or be -1 (skipped).
Groups GroupByTarget(const int64_t* idx, int64_t count, int64_t targets);

// When every row of idx (`rows` runs of `width` entries) lists distinct targets in ascending order followed
// only by -1 (a Rulebook's out_rows), the number of targets in each row; nothing otherwise. A fold can then
// find any target range's entries by binary search, and accumulate range by range in parallel. Checks
// every entry as GroupByTarget does.
std::optional<std::vector<int64_t>> AscendingRows(const Ort::KernelContext& ctx, const int64_t* idx, int64_t rows,
                                                  int64_t width, int64_t targets);

}  // namespace sparse_lower
