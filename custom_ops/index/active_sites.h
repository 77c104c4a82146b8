// ActiveSites (docs/custom_ops.md, "Index builders"): the sparse coordinates of a dense tensor.
#pragma once

#include "common/op.h"

namespace sparse_lower {

// coords [N, 1+D], sites [N, 1]: the active sites of a dense [B, C, *S] tensor, sorted.
struct ActiveSites {
  static constexpr const char* kName = "ActiveSites";
  static constexpr InputSpec kInputs[] = {{kFloat, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64, kInt64};

  explicit ActiveSites(const Ort::ConstKernelInfo&) {}
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext&) {}  // N is data-dependent
};

}  // namespace sparse_lower
