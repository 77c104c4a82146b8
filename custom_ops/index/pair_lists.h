// PairLists (docs/custom_ops.md, "Index tables of the nna target"): a neighbour table as per-tap lists of
// the pairs it holds, for the nna target's pairs combine, which multiplies only the rows that have a
// partner through each tap.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/op.h"

namespace sparse_lower {

// sources [Σ_k (c_k + 1)]: tap k's block holds the input row of each of its pairs in output order, then
// N (the zero row) up to c_k + 1 entries, c_k being capacities[k] or, without capacities, its pair count.
// positions [K, M]: where output m finds its pair of tap k within tap k's block (its first N: none).
// offsets [K + 1]: where each tap's block starts, then the total (the bounds of a Slice per tap).
class PairLists {
 public:
  static constexpr const char* kName = "PairLists";
  static constexpr InputSpec kInputs[] = {{kInt64, false}, {kAnyType, false}};  // nbr, like (shape only)
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64, kInt64, kInt64};

  explicit PairLists(const Ort::ConstKernelInfo& info);
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 private:
  std::optional<std::vector<int64_t>> capacities_;
  std::string option_;
};

}  // namespace sparse_lower
