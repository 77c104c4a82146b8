// CapacityPads (docs/custom_ops.md, "Index tables of the nna target"): the pads that grow rows to the
// fixed capacity the nna target's static shapes need, refusing rows beyond it instead of truncating them.
#pragma once

#include <cstdint>

#include "common/op.h"

namespace sparse_lower {

// pads [2·rank]: the pads of a standard Pad that grows axis 0 of x to `capacity` rows.
class CapacityPads {
 public:
  static constexpr const char* kName = "CapacityPads";
  static constexpr InputSpec kInputs[] = {{kAnyType, false}};  // x (shape only)
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64};

  explicit CapacityPads(const Ort::ConstKernelInfo& info);
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 private:
  int64_t capacity_;
};

}  // namespace sparse_lower
