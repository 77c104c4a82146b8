// ScatterMatrices (docs/custom_ops.md, "Index tables of the nna target"): a neighbour table as one 0/1
// matrix per tap, for the nna target's matmul combine.
#pragma once

#include <cstdint>

#include "common/op.h"

namespace sparse_lower {

// S [K, M, N] float: S[k, m, i] = 1 where nbr[m, k] = i, else 0; refused above max_bytes.
class ScatterMatrices {
 public:
  static constexpr const char* kName = "ScatterMatrices";
  static constexpr InputSpec kInputs[] = {{kInt64, false}, {kAnyType, false}};  // nbr, like (shape only)
  static constexpr ONNXTensorElementDataType kOutputs[] = {kFloat};

  explicit ScatterMatrices(const Ort::ConstKernelInfo& info);
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 private:
  int64_t max_bytes_;
};

}  // namespace sparse_lower
