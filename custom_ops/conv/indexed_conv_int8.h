// IndexedConvInt8: IndexedConv with 8-bit products: u8 input rows, int8 weights, int32 sums.
#pragma once

#include "common/op.h"
#include "common/packed_once.h"
#include "common/tensor.h"
#include "conv/conv_rows.h"
#include "conv/row_gemm_int8.h"

namespace sparse_lower {

// X [N, Cin] float rows, idx [M, K] (-1: no input through tap k), W [K, Cin, Cout] int8 within ±127
// (Cin ≤ 512) or ±63 (Cin ≤ 1024: every tap's sum below 2^24, exact in float), x_scale [Cin] and
// w_scale [K, Cout] float (> 0), optional B [Cout], coords [N, 1+D] and R [M, Cout] as in IndexedConv;
// attribute activation "none" (default) or "relu". Y [M, Cout] float:
//   q[n, c] = round(clamp(X[n, c] · (1 / x_scale[c]), 0, 255))      (float32; half to even; NaN → 0)
//   Y[m, o] = act(B[o] + Σ_k w_scale[k, o] · Σ_c q[idx[m, k], c] · W[k, c, o] + R[m, o])
// The taps are added in ascending k, each with one rounding, after the bias; then R, then the ReLU.
//
// Why u8 rows: the rows a ReLU made are ≥ 0, and u8 × s8 is what VNNI, AMX and AVX2 multiply. AVX2
// without VNNI does so only through vpmaddubsw (adjacent products summed to int16 with saturation), exact
// for |W| ≤ 63 (2 · 255 · 63 < 32767): there, weights past ±63 (sparse_lower.quantize's 8-bit weights)
// take the portable loop, with the same int32 sums, so the same bits, but slower. Rows are
// quantized once per call (each is read by up to K outputs), non-negative only: the rows a ReLU made.
// A per-channel x_scale costs nothing in the sums (sparse_lower.quantize folds it into w_scale's W).
class IndexedConvInt8 {
 public:
  static constexpr const char* kName = "IndexedConvInt8";
  static constexpr InputSpec kInputs[] = {{kFloat, false}, {kInt64, false}, {kInt8, false}, {kFloat, false},
                                          {kFloat, false}, {kFloat, true},  {kInt64, true}, {kFloat, true}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kFloat};

  explicit IndexedConvInt8(const Ort::ConstKernelInfo& info);
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 protected:  // the CUDA kernel (cuda/device/ops.cu) derives from it, sharing its checks
  // The inputs, their shapes checked (and Cin's bound); their values are each kernel's to check.
  struct Inputs {
    Input<float> x, x_scale, w_scale;
    Input<int64_t> idx;
    Input<int8_t> w;
    ConvShapes shapes;
    const float* bias;      // null without one
    const float* residual;  // null without one
  };
  static Inputs Read(const Ort::KernelContext& ctx);

  bool relu_;

 private:
  PackedOnce<PackedWeights> packed_;  // W per tap
};

}  // namespace sparse_lower
