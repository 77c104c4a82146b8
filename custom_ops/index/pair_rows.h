// PairRows (docs/custom_ops.md, "Index tables of the nna target"): the check that features and coords
// pair row by row, where no kernel downstream would make it (the nna compute; the gpu target's dense
// outputs of the user's feeds).
#pragma once

#include "common/op.h"

namespace sparse_lower {

// features [N, C], unchanged, after checking that coords [N, 1 + D] has as many rows.
struct PairRows {
  static constexpr const char* kName = "PairRows";
  static constexpr InputSpec kInputs[] = {{kFloat, false}, {kInt64, false}};  // features, coords (shape only)
  static constexpr ONNXTensorElementDataType kOutputs[] = {kFloat};

  explicit PairRows(const Ort::ConstKernelInfo&) {}
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);
};

}  // namespace sparse_lower
