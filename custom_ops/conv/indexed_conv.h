// IndexedConv: Y[m] = act(B + Σ_k X[idx[m, k]] · W[k] + R[m]), the whole sparse conv over an index table
// in one op, with the bias, a residual and a ReLU that follow it applied while its rows are in cache.
#pragma once

#include "common/op.h"
#include "common/packed_once.h"
#include "common/tensor.h"
#include "conv/conv_rows.h"
#include "conv/row_gemm_bf16.h"

namespace sparse_lower {

// X [N, Cin] rows, idx [M, K] (-1: no input through tap k), W [K, Cin, Cout], optional bias B [Cout],
// optional coords [N, 1+D] (the features/coords pairing check, as in IndexedUnfold), optional residual
// R [M, Cout] added after every tap; attribute activation "none" (default) or "relu", attribute precision
// "float32" (default) or "bfloat16": X and W rounded to bfloat16, the products summed in float32
// (conv/row_gemm_bf16.h; AMX tiles on the CPU where it has them, for 16 input channels or more; tensor
// cores on CUDA). Y [M, Cout].
//
// IndexedUnfold → MatMul → IndexedFold with the gather, the products and the fold fused: output rows
// are taken in blocks that stay in cache, and within a block, tap by tap, the rows that have an input
// through the tap are multiplied straight from X into Y (conv/row_gemm.h). Nothing of size pairs × C
// goes through memory, and a missing neighbour costs nothing. Each row of Y receives its taps in
// ascending k, so results do not depend on the thread count. The epilogue (R, then the ReLU) runs on a
// block once its taps are summed: the same sums, in the same order, as the `Add` and `Relu` it replaces.
class IndexedConv {
 public:
  static constexpr const char* kName = "IndexedConv";
  static constexpr InputSpec kInputs[] = {
      {kFloat, false}, {kInt64, false}, {kFloat, false}, {kFloat, true}, {kInt64, true}, {kFloat, true}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kFloat};

  explicit IndexedConv(const Ort::ConstKernelInfo& info);
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 protected:  // the CUDA kernels (cuda/device/ops.cu) derive from these, sharing their checks
  // The inputs, checked.
  struct Inputs {
    Input<float> x, w;
    Input<int64_t> idx;
    ConvShapes shapes;
    const float* bias;      // null without one
    const float* residual;  // null without one
  };
  static Inputs Read(const Ort::KernelContext& ctx);

  bool relu_;
  bool bf16_;

 private:
  // Compute at precision "bfloat16" on AMX tiles: X converted to bfloat16 rows once, W per tap.
  void ComputeOnTiles(const Ort::KernelContext& ctx, const Inputs& in, float* y) const;

  PackedOnce<Bf16Weights> tiles_;  // W per tap at precision "bfloat16" on the tiles
};

}  // namespace sparse_lower
