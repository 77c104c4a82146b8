// What IndexedConv and IndexedConvInt8 share: the checks of their common inputs and the passes that start
// and finish a block of output rows.
#pragma once

#include <cstdint>
#include <vector>

#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

// Output rows per block: a block's rows of Y (256 × 64 floats = 64 KiB) stay in L2 while all K taps
// add into them. The blocks are fixed by this constant alone, never by the thread count.
constexpr int64_t kConvBlockRows = 256;

struct ConvShapes {
  int64_t inputs, cin, rows, taps, cout;
};

// X [N, Cin], idx [M, K], W [K, Cin, Cout] (any element type), and the optional B [Cout], coords
// [N, 1+D] and R [M, Cout] (inputs `optional`, `optional` + 1 and + 2) against them.
ConvShapes CheckConvShapes(const Ort::KernelContext& ctx, const std::vector<int64_t>& x,
                           const std::vector<int64_t>& idx, const std::vector<int64_t>& w, size_t optional);

// Rows [begin, end) of Y set to the bias, or to zero without one.
void StartRows(float* y, const float* bias, int64_t begin, int64_t end, int64_t cout);

// Rows [begin, end) of Y once every tap is in: + R, then the ReLU (NaN stays NaN, as in onnxruntime's Relu).
void FinishRows(float* y, const float* residual, bool relu, int64_t begin, int64_t end, int64_t cout);

}  // namespace sparse_lower
