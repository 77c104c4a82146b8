// CoalesceMap (docs/custom_ops.md, "Index builders"): the distinct sites of a coordinate table whose rows
// may repeat a site, and the rows that share each one.
#pragma once

#include <cstdint>

#include "common/coords.h"
#include "common/op.h"

namespace sparse_lower {

// out_coords [M, 1+D]: the distinct sites, sorted; members [M, R]: the input rows at each site in input
// order, −1 after the last. R is the most rows any site has (at least 1), or attribute `members` when it
// is given (the nna target's static shapes), a site with more rows being an error.
class CoalesceMap {
 public:
  static constexpr const char* kName = "CoalesceMap";
  static constexpr InputSpec kInputs[] = {{kInt64, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64, kInt64};

  explicit CoalesceMap(const Ort::ConstKernelInfo& info);
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 protected:  // the CUDA kernel (cuda/device/ops.cu) derives from it, sharing its checks
  Grid grid_;
  int64_t members_;  // 0: as many as the fullest site needs
};

}  // namespace sparse_lower
