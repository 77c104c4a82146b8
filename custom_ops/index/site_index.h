// SiteIndex (docs/custom_ops.md, "Index builders"): where coordinates lie in a dense tensor.
#pragma once

#include "common/coords.h"
#include "common/op.h"

namespace sparse_lower {

// sites [N]: linear sites of coordinates in a dense [batch_size, C, *spatial_shape] tensor.
class SiteIndex {
 public:
  static constexpr const char* kName = "SiteIndex";
  static constexpr InputSpec kInputs[] = {{kInt64, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64};

  explicit SiteIndex(const Ort::ConstKernelInfo& info);
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 protected:  // the CUDA kernels (cuda/device/ops.cu) derive from these, sharing their checks
  Grid grid_;
  int64_t batch_size_;
};

}  // namespace sparse_lower
