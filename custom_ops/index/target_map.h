// TargetMap (docs/custom_ops.md, "Index builders"): the neighbour table of a convolution whose outputs are
// given: a transposed one, as in a submanifold inverse deconvolution, or (transposed = 0) a strided one,
// whose outputs the floor rule chose.
#pragma once

#include "common/op.h"
#include "index/geometry.h"

namespace sparse_lower {

// nbr [M, K] of a convolution whose outputs are target_coords [M, 1+D], in their order.
class TargetMap {
 public:
  static constexpr const char* kName = "TargetMap";
  static constexpr InputSpec kInputs[] = {{kInt64, false}, {kInt64, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64};

  explicit TargetMap(const Ort::ConstKernelInfo& info) : geometry_(info, Kind(info)) {}
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 protected:  // the CUDA kernels (cuda/device/ops.cu) derive from these, sharing their checks
  MapGeometry geometry_;

 private:
  static MapKind Kind(const Ort::ConstKernelInfo& info);
};

}  // namespace sparse_lower
