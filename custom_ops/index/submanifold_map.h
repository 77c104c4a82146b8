// SubmanifoldMap (docs/custom_ops.md, "Index builders"): the neighbour table of a submanifold conv, whose
// outputs are its inputs.
#pragma once

#include "common/op.h"
#include "index/geometry.h"

namespace sparse_lower {

// nbr [N, K]: for each active site, the row each tap of a centred kernel reads.
class SubmanifoldMap {
 public:
  static constexpr const char* kName = "SubmanifoldMap";
  static constexpr InputSpec kInputs[] = {{kInt64, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64};

  explicit SubmanifoldMap(const Ort::ConstKernelInfo& info) : geometry_(info, MapKind::kSubmanifold) {}
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 protected:  // the CUDA kernels (cuda/device/ops.cu) derive from these, sharing their checks
  MapGeometry geometry_;
};

}  // namespace sparse_lower
