// InverseMap (docs/custom_ops.md, "Index tables of the nna target"): a neighbour table read the other
// way, input row to output row, for the nna target's scatter combine.
#pragma once

#include "common/op.h"

namespace sparse_lower {

// inv [K, N]: for each tap k and input row i, the output row that reads i through k, or -1.
struct InverseMap {
  static constexpr const char* kName = "InverseMap";
  static constexpr InputSpec kInputs[] = {{kInt64, false}, {kAnyType, false}};  // nbr, like (shape only)
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64};

  explicit InverseMap(const Ort::ConstKernelInfo&) {}
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);
};

}  // namespace sparse_lower
