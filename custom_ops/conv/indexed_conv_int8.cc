#include "conv/indexed_conv_int8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/attributes.h"
#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"
#include "common/vector_units.h"
#include "conv/conv_rows.h"
#include "conv/row_gemm_int8.h"
#include "conv/tap_lists.h"

namespace sparse_lower {
namespace {

constexpr size_t kOptional = 5;  // B, coords, R
constexpr float kCodes = 255.0f;
constexpr int64_t kMaxChannels = 1024;  // Cin · 255 · 63 < 2^24: a tap's sum converts to float exactly
constexpr int64_t kMaxWideChannels = 512;  // Cin · 255 · 127 < 2^24: the same with 8-bit weights

// |W|'s bound for Cin input channels: 127 (8 bits) up to kMaxWideChannels, 63 (7 bits) above, so that
// every tap's sum stays exact in float.
int64_t MaxWeight(int64_t cin) { return cin <= kMaxWideChannels ? 127 : 63; }

void CheckScaleShape(const Input<float>& scales, const std::vector<int64_t>& shape, const char* name) {
  if (scales.shape != shape) Fail(name, " must have shape ", List(shape), ", got ", List(scales.shape));
}

void CheckScales(const Input<float>& scales, const char* name) {
  for (int64_t i = 0; i < scales.Size(); ++i) {
    if (!(scales.data[i] > 0.0f) || !std::isfinite(scales.data[i])) {
      Fail(name, " must be finite and positive, got ", scales.data[i], " at flat index ", i);
    }
  }
}

void CheckWeights(const Input<int8_t>& w, int64_t cin) {
  const int64_t most = MaxWeight(cin);
  for (int64_t i = 0; i < w.Size(); ++i) {
    if (w.data[i] < -most || w.data[i] > most) {
      Fail("W must be within [-", most, ", ", most, "] with Cin = ", cin, " (see IndexedConvInt8), got ",
           int{w.data[i]}, " at flat index ", i, "; quantize with sparse_lower.quantize");
    }
  }
}

// Row n's u8 codes (see the header: x · (1 / x_scale) in float, clamped, rounded to nearest even).
void QuantizeRow(const float* x, const float* inverse, int64_t cin, uint8_t* q) {
  for (int64_t c = 0; c < cin; ++c) {
    float v = x[c] * inverse[c];
    v = v > 0.0f ? v : 0.0f;  // negative and NaN: 0
    v = v < kCodes ? v : kCodes;
    q[c] = static_cast<uint8_t>(std::nearbyint(v));
  }
}

#if defined(__x86_64__)
// The same 8 channels at a time: max(v, 0) returns 0 for NaN as the comparison above does, and the
// conversion rounds to nearest even (the default rounding mode, which nearbyint uses too).
__attribute__((target("avx2"))) void QuantizeRowVector(const float* x, const float* inverse, int64_t cin, uint8_t* q) {
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(kCodes);
  int64_t c = 0;
  for (; c + 8 <= cin; c += 8) {
    const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c), _mm256_loadu_ps(inverse + c)),
                                                 zero), top);
    const __m256i codes = _mm256_cvtps_epi32(v);
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + c), _mm_packus_epi16(words, words));
  }
  QuantizeRow(x + c, inverse + c, cin - c, q + c);
}
#endif

// X quantized to u8 rows of `stride` bytes (PackedWeights::RowBytes: zeros after Cin). Why once per
// call: each row is read by up to K outputs. Left uninitialised but for the padding: every code is written.
std::unique_ptr<uint8_t[]> QuantizeRows(const Ort::KernelContext& ctx, const Input<float>& x, const float* scale,
                                        int64_t stride) {
  const int64_t rows = x.shape[0], cin = x.shape[1];
  std::vector<float> inverse(static_cast<size_t>(cin));
  for (int64_t c = 0; c < cin; ++c) inverse[static_cast<size_t>(c)] = 1.0f / scale[c];
  std::unique_ptr<uint8_t[]> q(new uint8_t[static_cast<size_t>(rows * stride)]);
  ParallelFor(ctx, rows, Grain(cin), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      uint8_t* row = q.get() + n * stride;
      std::fill(row + cin, row + stride, uint8_t{0});
#if defined(__x86_64__)
      if (HasVectorUnits()) {
        QuantizeRowVector(x.data + n * cin, inverse.data(), cin, row);
        continue;
      }
#endif
      QuantizeRow(x.data + n * cin, inverse.data(), cin, row);
    }
  });
  return q;
}

}  // namespace

IndexedConvInt8::IndexedConvInt8(const Ort::ConstKernelInfo& info)
    : relu_(Choice(info, "activation", {"none", "relu"}) == 1), packed_(info, 2) {}

IndexedConvInt8::Inputs IndexedConvInt8::Read(const Ort::KernelContext& ctx) {
  Inputs in{ReadInput<float>(ctx, 0), ReadInput<float>(ctx, 3), ReadInput<float>(ctx, 4), ReadInput<int64_t>(ctx, 1),
            ReadInput<int8_t>(ctx, 2)};
  const ConvShapes& s = in.shapes = CheckConvShapes(ctx, in.x.shape, in.idx.shape, in.w.shape, kOptional);
  if (s.cin > kMaxChannels) {
    Fail("Cin = ", s.cin, " is above the ", kMaxChannels, " input channels this op sums exactly");
  }
  CheckScaleShape(in.x_scale, {s.cin}, "x_scale");
  CheckScaleShape(in.w_scale, {s.taps, s.cout}, "w_scale");
  in.bias = HasInput(ctx, kOptional) ? ReadInput<float>(ctx, kOptional).data : nullptr;
  in.residual = HasInput(ctx, kOptional + 2) ? ReadInput<float>(ctx, kOptional + 2).data : nullptr;
  return in;
}

void IndexedConvInt8::Compute(const Ort::KernelContext& ctx) const {
  const Inputs in = Read(ctx);
  const Input<float>& x = in.x;
  const Input<int64_t>& idx = in.idx;
  const Input<int8_t>& w = in.w;
  const Input<float>& w_scale = in.w_scale;
  const ConvShapes& s = in.shapes;
  const float* bias = in.bias;
  const float* residual = in.residual;
  CheckScales(in.x_scale, "x_scale");
  CheckScales(w_scale, "w_scale");
  CheckWeights(w, s.cin);
  float* y = AllocateOutput<float>(ctx, 0, {s.rows, s.cout});

  const int64_t stride = PackedWeights::RowBytes(s.cin);
  const std::unique_ptr<uint8_t[]> q = QuantizeRows(ctx, x, in.x_scale.data, stride);
  std::vector<PackedWeights> per_call;
  const std::vector<PackedWeights>& packed = packed_.Get(w.data, s.taps, s.cin, s.cout, per_call);

  ParallelFor(ctx, s.rows, kConvBlockRows, [&](int64_t begin, int64_t end) {
    StartRows(y, bias, begin, end, s.cout);
    TapLists<uint8_t> lists(s.taps, end - begin);
    lists.Fill(idx.data, begin, end, s.inputs, q.get(), stride, y, s.cout);
    for (int64_t k = 0; k < s.taps; ++k) {
      AccumulateRowsInt8(lists.Sources(k), lists.Targets(k), lists.Count(k), packed[static_cast<size_t>(k)],
                         w_scale.data + k * s.cout, s.cout);
    }
    FinishRows(y, residual, relu_, begin, end, s.cout);
  });
}

void IndexedConvInt8::InferShapes(const ShapeContext& ctx) {
  const Shape& idx = ctx.Input(1);
  const Shape& w = ctx.Input(2);
  if (idx.size() != 2 || w.size() != 3) return;
  ctx.SetOutput(0, {idx[0], w[2]}, kFloat);
}

}  // namespace sparse_lower
