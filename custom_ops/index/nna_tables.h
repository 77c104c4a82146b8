// The index tables of the nna target (docs/custom_ops.md, "Index tables of the nna target"): built
// outside the accelerator for the combine methods that run on it with standard ops only.
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
