#include "conv/indexed_conv.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "common/attributes.h"
#include "common/parallel.h"
#include "common/tensor.h"
#include "common/vector_units.h"
#include "conv/amx_rows.h"
#include "conv/conv_rows.h"
#include "conv/row_gemm.h"
#include "conv/row_gemm_bf16.h"
#include "conv/tap_lists.h"

namespace sparse_lower {
namespace {

// The tiles take layers of at least this many input channels at precision "bfloat16"; narrower ones run
// the float32 kernel on the rounded values. On the CenterPoint backbone (Xeon, 2 threads: `bench --suite
// layers`), against float32: its 5-channel layer 0.67x as fast on the tiles, 0.91-0.95x on rounded
// values; its 16-channel ones 0.96-1.06x on the tiles, 0.87-1.00x on rounded values (the rounding of X
// is a pass of its own); its 32-, 64- and 128-channel ones 1.1x, 2.1x and 3.5x on the tiles.
constexpr int64_t kLeastTileChannels = 16;

// `values` rounded to bfloat16, as float32 (the products of two are then exact in float32).
std::vector<float> Bf16Rounded(const Ort::KernelContext& ctx, const float* values, int64_t count) {
  std::vector<float> rounded(static_cast<size_t>(count));
  ParallelFor(ctx, count, Grain(1), [&](int64_t begin, int64_t end) {
    RoundToBf16(values + begin, end - begin, rounded.data() + begin);
  });
  return rounded;
}

}  // namespace

IndexedConv::IndexedConv(const Ort::ConstKernelInfo& info)
    : relu_(Choice(info, "activation", {"none", "relu"}) == 1),
      bf16_(Choice(info, "precision", {"float32", "bfloat16"}) == 1),
      tiles_(info, 2) {}

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
  if (bf16_ && HasAmxBf16() && s.cin >= kLeastTileChannels) {
    ComputeOnTiles(ctx, in, y);
    return;
  }
  // bfloat16 without the tiles: the float32 GEMM on the rounded values (conv/row_gemm_bf16.h)
  const std::vector<float> x_rounded = bf16_ ? Bf16Rounded(ctx, x.data, s.inputs * s.cin) : std::vector<float>();
  const std::vector<float> w_rounded = bf16_ ? Bf16Rounded(ctx, w.data, s.taps * s.cin * s.cout) : std::vector<float>();
  const float* rows = bf16_ ? x_rounded.data() : x.data;
  const float* weights = bf16_ ? w_rounded.data() : w.data;

  ParallelFor(ctx, s.rows, kConvBlockRows, [&](int64_t begin, int64_t end) {
    StartRows(y, bias, begin, end, s.cout);
    TapLists<float> lists(s.taps, end - begin);
    lists.Fill(idx.data, begin, end, s.inputs, rows, s.cin, y, s.cout);
    for (int64_t k = 0; k < s.taps; ++k) {
      AccumulateRows(lists.Sources(k), lists.Targets(k), lists.Count(k), s.cin, weights + k * s.cin * s.cout, s.cout);
    }
    FinishRows(y, residual, relu_, begin, end, s.cout);
  });
}

void IndexedConv::ComputeOnTiles(const Ort::KernelContext& ctx, const Inputs& in, float* y) const {
#if defined(__x86_64__)
  const ConvShapes& s = in.shapes;
  std::unique_ptr<uint16_t[]> x(new uint16_t[static_cast<size_t>(s.inputs * s.cin)]);
  ParallelFor(ctx, s.inputs * s.cin, Grain(1), [&](int64_t begin, int64_t end) {
    ToBf16(in.x.data + begin, end - begin, x.get() + begin);
  });
  std::vector<Bf16Weights> per_call;
  const std::vector<Bf16Weights>& packed = tiles_.Get(in.w.data, s.taps, s.cin, s.cout, per_call);
  ParallelFor(ctx, s.rows, kConvBlockRows, [&](int64_t begin, int64_t end) {
    StartRows(y, in.bias, begin, end, s.cout);
    TapLists<uint16_t> lists(s.taps, end - begin);
    lists.Fill(in.idx.data, begin, end, s.inputs, x.get(), s.cin, y, s.cout);
    for (int64_t k = 0; k < s.taps; ++k) {
      AmxRowsBf16(lists.Sources(k), lists.Targets(k), lists.Count(k), s.cin, packed[static_cast<size_t>(k)], s.cout);
    }
    FinishRows(y, in.residual, relu_, begin, end, s.cout);
  });
#else
  (void)ctx, (void)in, (void)y;  // HasAmxBf16() is false off x86-64
#endif
}

void IndexedConv::InferShapes(const ShapeContext& ctx) {
  const Shape& idx = ctx.Input(1);
  const Shape& w = ctx.Input(2);
  if (idx.size() != 2 || w.size() != 3) return;
  ctx.SetOutput(0, {idx[0], w[2]}, kFloat);
}

}  // namespace sparse_lower
