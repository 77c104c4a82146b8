#include "conv/indexed_conv.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/coords.h"
#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"
#include "conv/row_gemm.h"

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
  return shapes;
}

}  // namespace

void IndexedConv::Compute(const Ort::KernelContext& ctx) const {
  const Input<float> x = ReadInput<float>(ctx, 0);
  const Input<int64_t> idx = ReadInput<int64_t>(ctx, 1);
  const Input<float> w = ReadInput<float>(ctx, 2);
  const Shapes s = CheckShapes(ctx, x, idx, w);
  const float* bias = HasInput(ctx, 3) ? ReadInput<float>(ctx, 3).data : nullptr;
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
    std::vector<const float*> sources(static_cast<size_t>(end - begin));
    std::vector<float*> targets(static_cast<size_t>(end - begin));
    for (int64_t k = 0; k < s.taps; ++k) {
      int64_t n = 0;  // the block's rows that read an input through tap k
      for (int64_t m = begin; m < end; ++m) {
        const int64_t source = idx.data[m * s.taps + k];
        if (static_cast<uint64_t>(source + 1) > static_cast<uint64_t>(s.inputs)) {  // outside [-1, N)
          Fail("idx value ", source, " (row ", m, ", tap ", k, ") is outside [0, ", s.inputs,
               "), the rows of X; only -1 marks a missing input");
        }
        sources[n] = x.data + std::max<int64_t>(source, 0) * s.cin;  // overwritten when -1
        targets[n] = y + m * s.cout;
        n += source >= 0;
      }
      AccumulateRows(sources.data(), targets.data(), n, s.cin, w.data + k * s.cin * s.cout, s.cout);
    }
  });
}

void IndexedConv::InferShapes(const ShapeContext& ctx) {
  const Shape& idx = ctx.Input(1);
  const Shape& w = ctx.Input(2);
  if (idx.size() != 2 || w.size() != 3) return;
  ctx.SetOutput(0, {idx[0], w[2]}, kFloat);
}

}  // namespace sparse_lower
