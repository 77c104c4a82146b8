// StridedMap (docs/custom_ops.md, "Index builders"): the output coordinates and neighbour table of a
// sparse convolution. Its kernel is ReachedMap's (index/reached_map.cc), on a convolution's geometry.
#pragma once

#include "index/reached_map.h"

namespace sparse_lower {

// out_coords [M, 1+D], nbr [M, K] of a sparse convolution.
struct StridedMap : ReachedMap {
  static constexpr const char* kName = "StridedMap";
  explicit StridedMap(const Ort::ConstKernelInfo& info) : ReachedMap(info, MapKind::kStrided) {}
};

}  // namespace sparse_lower
