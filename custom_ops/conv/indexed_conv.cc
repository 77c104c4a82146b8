#include "conv/indexed_conv.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/attributes.h"
#include "common/coords.h"
#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"
#include "conv/row_gemm.h"
#include "conv/tap_lists.h"

namespace sparse_lower {
namespace {

// Output rows per block: a block's rows of Y (256 × 64 floats = 64 KiB) stay in L2 while all K taps
// add into them. The blocks are fixed by this constant alone, never by the thread count.
constexpr int64_t kBlockRows = 256;

struct Shapes {
  int64_t inputs, cin, rows, taps, cout;
};

Shapes CheckShapes(const Ort::KernelContext& ctx, const Input<float>& x, const Input<int64_t>& idx,
                   const Input<float>& w) {
  if (x.Rank() != 2) Fail("X must be rows [N, Cin], got shape ", List(x.shape));
  if (idx.Rank() != 2) Fail("idx must be a table [M, K], got shape ", List(idx.shape));
  if (w.Rank() != 3 || w.shape[0] != idx.shape[1] || w.shape[1] != x.shape[1]) {
    Fail("W must have shape [K, Cin, Cout] = [", idx.shape[1], ", ", x.shape[1], ", Cout], got ", List(w.shape));
  }
  const Shapes shapes{x.shape[0], x.shape[1], idx.shape[0], idx.shape[1], w.shape[2]};
  if (HasInput(ctx, 3)) {
    const std::vector<int64_t> bias = InputShape(ctx, 3);
    if (bias != std::vector<int64_t>{shapes.cout}) {
      Fail("B must have shape [Cout] = [", shapes.cout, "], got ", List(bias));
    }
  }
  CheckCoordsPairing(ctx, 4, shapes.inputs);
  if (HasInput(ctx, 5)) {
    const std::vector<int64_t> residual = InputShape(ctx, 5);
    if (residual != std::vector<int64_t>{shapes.rows, shapes.cout}) {
      Fail("R must have shape [M, Cout] = [", shapes.rows, ", ", shapes.cout, "] (a residual on the output rows), got ",
           List(residual));
    }
  }
  return shapes;
}

// Rows [begin, end) of Y once every tap is in: + R, then the ReLU (NaN stays NaN, as in onnxruntime's Relu).
void Epilogue(float* y, const float* residual, bool relu, int64_t begin, int64_t end, int64_t cout) {
  if (residual != nullptr) {
    for (int64_t i = begin * cout; i < end * cout; ++i) y[i] += residual[i];
  }
  if (relu) {
    for (int64_t i = begin * cout; i < end * cout; ++i) y[i] = y[i] < 0.0f ? 0.0f : y[i];
  }
}

}  // namespace

IndexedConv::IndexedConv(const Ort::ConstKernelInfo& info) : relu_(Choice(info, "activation", {"none", "relu"}) == 1) {}

void IndexedConv::Compute(const Ort::KernelContext& ctx) const {
  const Input<float> x = ReadInput<float>(ctx, 0);
  const Input<int64_t> idx = ReadInput<int64_t>(ctx, 1);
  const Input<float> w = ReadInput<float>(ctx, 2);
  const Shapes s = CheckShapes(ctx, x, idx, w);
  const float* bias = HasInput(ctx, 3) ? ReadInput<float>(ctx, 3).data : nullptr;
  const float* residual = HasInput(ctx, 5) ? ReadInput<float>(ctx, 5).data : nullptr;
  float* y = AllocateOutput<float>(ctx, 0, {s.rows, s.cout});

  ParallelFor(ctx, s.rows, kBlockRows, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      float* row = y + m * s.cout;
      if (bias == nullptr) {
        std::fill(row, row + s.cout, 0.0f);
      } else {
        std::copy_n(bias, s.cout, row);
      }
    }
    TapLists lists(s.taps, end - begin);
    lists.Fill(idx.data, begin, end, s.inputs, x.data, s.cin, y, s.cout);
    for (int64_t k = 0; k < s.taps; ++k) {
      AccumulateRows(lists.Sources(k), lists.Targets(k), lists.Count(k), s.cin, w.data + k * s.cin * s.cout, s.cout);
    }
    Epilogue(y, residual, relu_, begin, end, s.cout);
  });
}

void IndexedConv::InferShapes(const ShapeContext& ctx) {
  const Shape& idx = ctx.Input(1);
  const Shape& w = ctx.Input(2);
  if (idx.size() != 2 || w.size() != 3) return;
  ctx.SetOutput(0, {idx[0], w[2]}, kFloat);
}

}  // namespace sparse_lower
