// TargetMap (docs/custom_ops.md, "Index builders"): the neighbour table of a transposed convolution
// whose outputs are given, as in a submanifold inverse deconvolution.
#pragma once

#include "common/op.h"
#include "index/geometry.h"

namespace sparse_lower {

// nbr [M, K] of a transposed convolution whose outputs are target_coords [M, 1+D], in their order.
class TargetMap {
 public:
  static constexpr const char* kName = "TargetMap";
  static constexpr InputSpec kInputs[] = {{kInt64, false}, {kInt64, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64};

  explicit TargetMap(const Ort::ConstKernelInfo& info) : geometry_(info, MapKind::kTransposed) {}
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 protected:  // the CUDA kernels (cuda/device/ops.cu) derive from these, sharing their checks
  MapGeometry geometry_;
};

}  // namespace sparse_lower
