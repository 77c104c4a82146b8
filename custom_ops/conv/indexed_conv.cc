#include "conv/indexed_conv.h"

#include <cstdint>

#include "common/attributes.h"
#include "common/parallel.h"
#include "common/tensor.h"
#include "conv/conv_rows.h"
#include "conv/row_gemm.h"
#include "conv/tap_lists.h"

namespace sparse_lower {

IndexedConv::IndexedConv(const Ort::ConstKernelInfo& info) : relu_(Choice(info, "activation", {"none", "relu"}) == 1) {}

IndexedConv::Inputs IndexedConv::Read(const Ort::KernelContext& ctx) {
  Inputs in{ReadInput<float>(ctx, 0), ReadInput<float>(ctx, 2), ReadInput<int64_t>(ctx, 1)};
  in.shapes = CheckConvShapes(ctx, in.x.shape, in.idx.shape, in.w.shape, 3);
  in.bias = HasInput(ctx, 3) ? ReadInput<float>(ctx, 3).data : nullptr;
  in.residual = HasInput(ctx, 5) ? ReadInput<float>(ctx, 5).data : nullptr;
  return in;
}

void IndexedConv::Compute(const Ort::KernelContext& ctx) const {
  const Inputs in = Read(ctx);
  const Input<float>& x = in.x;
  const Input<int64_t>& idx = in.idx;
  const Input<float>& w = in.w;
  const ConvShapes& s = in.shapes;
  const float* bias = in.bias;
  const float* residual = in.residual;
  float* y = AllocateOutput<float>(ctx, 0, {s.rows, s.cout});

  ParallelFor(ctx, s.rows, kConvBlockRows, [&](int64_t begin, int64_t end) {
    StartRows(y, bias, begin, end, s.cout);
    TapLists<float> lists(s.taps, end - begin);
    lists.Fill(idx.data, begin, end, s.inputs, x.data, s.cin, y, s.cout);
    for (int64_t k = 0; k < s.taps; ++k) {
      AccumulateRows(lists.Sources(k), lists.Targets(k), lists.Count(k), s.cin, w.data + k * s.cin * s.cout, s.cout);
    }
    FinishRows(y, residual, relu_, begin, end, s.cout);
  });
}

void IndexedConv::InferShapes(const ShapeContext& ctx) {
  const Shape& idx = ctx.Input(1);
  const Shape& w = ctx.Input(2);
  if (idx.size() != 2 || w.size() != 3) return;
  ctx.SetOutput(0, {idx[0], w[2]}, kFloat);
}

}  // namespace sparse_lower
