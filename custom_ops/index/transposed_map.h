// TransposedMap (docs/custom_ops.md, "Index builders"): the output coordinates and neighbour table of a
// sparse transposed convolution. Its kernel is ReachedMap's (index/reached_map.cc), on a transposed
// convolution's geometry.
#pragma once

#include "index/reached_map.h"

namespace sparse_lower {

// out_coords [M, 1+D], nbr [M, K] of a sparse transposed convolution.
struct TransposedMap : ReachedMap {
  static constexpr const char* kName = "TransposedMap";
  explicit TransposedMap(const Ort::ConstKernelInfo& info) : ReachedMap(info, MapKind::kTransposed) {}
};

}  // namespace sparse_lower
