// CoalesceMap per element (docs/custom_ops.md, "Index builders"): the rows' linear sites stably sorted
// with their rows, each run of equal sites a group, the distinct site's output row.
//
// The CPU library walks the sorted list once; a GPU thread per position needs the groups' starts
// first (a flag per position, then the backend's Select), after which every group's size and every
// table entry is one lookup.
#pragma once

#include <cstdint>

#include "cuda/hd.h"

namespace sparse_lower {
namespace bodies {

// Whether position i of the sorted sites starts a group (the first of its site).
SL_HD inline bool StartsGroup(const int64_t* sorted, int64_t i) { return i == 0 || sorted[i] != sorted[i - 1]; }

// The end of group g (the start of the next, or the rows' count after the last).
SL_HD inline int64_t GroupEnd(const int64_t* starts, int64_t groups, int64_t rows, int64_t g) {
  return g + 1 < groups ? starts[g + 1] : rows;
}

// members[g, j]: the j-th row of group g in input order (the stable sort keeps it), or −1 past its last.
SL_HD inline int64_t Member(const int64_t* order, const int64_t* starts, int64_t groups, int64_t rows, int64_t g,
                            int64_t j) {
  const int64_t at = starts[g] + j;
  return at < GroupEnd(starts, groups, rows, g) ? order[at] : -1;
}

}  // namespace bodies
}  // namespace sparse_lower
