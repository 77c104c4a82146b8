// Rulebook (docs/custom_ops.md, "Index builders"): a neighbour table turned weight-stationary.
#pragma once

#include <cstdint>
#include <vector>

#include "common/op.h"

namespace sparse_lower {

// For each of `groups` groups of taps: in_rows [Kg, Pg], out_rows [Kg, Pg], taps [Kg]. An
// output-stationary nbr turned weight-stationary, its taps grouped by pair count so that padding every
// tap of a group to the group's largest count wastes little.
class Rulebook {
 public:
  static constexpr const char* kName = "Rulebook";
  static constexpr InputSpec kInputs[] = {{kInt64, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64};
  static constexpr int kVariadicOutputs = 3;

  explicit Rulebook(const Ort::ConstKernelInfo& info);
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext&) {}  // every size is data-dependent

 private:
  int64_t groups_;
  std::vector<int64_t> skip_taps_;
};

}  // namespace sparse_lower
