// IndexedConvInt8 on a GPU (docs/custom_ops.md): the float conv's tiling (cuda/bodies/conv.h: 64 × 64
// output tiles, the taps in ascending k, a tap no row of the tile has skipped) with 8-bit products on
// tensor cores and the CPU kernel's float steps, so that the result has the CPU library's bits:
//   Y[m, o] = act(B[o] + Σ_k w_scale[k, o] · S_k[m, o] + R[m, o]),  S_k = Σ_c q[idx[m, k], c] · W[k, c, o],
// each tap added by one fused multiply-add, in ascending k, and only where row m has an input through k
// (the CPU's tap lists hold no other rows).
//
// The codes q are u8 and the weights s8, a pair the tensor cores' 8-bit fragments do not mix; so the
// codes enter centred, q − 128 in s8, and each tap's sum takes back 128 · Σ_c W[k, c, o] (a constant per
// tap and output column, computed once per call). The sums are exact integers either way (|S| < 2^24,
// which makes the float conversion exact too), so the order of the products never shows.
//
// A launch runs the phases in order with barriers between them, as the float conv: cuda/device/cuda_backend.cu
// on the GPU (four warps of 32 × 32, 16 × 16 × 16 integer fragments), cuda/emulated/host_backend.cc one
// thread after another on the host.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/bodies/conv.h"
#include "cuda/hd.h"

namespace sparse_lower {
namespace bodies {

constexpr int kInt8Threads = 32 * kHalfWarps;                        // the float16 tile's four warps
constexpr int kInt8PerThread = kTileRows * kTileCols / kInt8Threads;  // 32 accumulators
constexpr int32_t kCodeCentre = 128;
constexpr float kTopCode = 255.0f;
constexpr int64_t kMaxInt8Channels = 1024;     // Cin · 255 · 63 < 2^24
constexpr int64_t kMaxWideInt8Channels = 512;  // Cin · 255 · 127 < 2^24

// |W|'s bound for Cin input channels, as the CPU library's: 127 up to kMaxWideInt8Channels, 63 above.
SL_HD inline int MaxWeight(int64_t cin) { return cin <= kMaxWideInt8Channels ? 127 : 63; }

struct Int8ConvArgs {
  ConvArgs conv;            // idx, shapes, bias, residual, relu and y; conv.x and conv.w are unused
  const uint8_t* q;         // [inputs, cin]: X's codes
  const int8_t* w;          // [taps, cin, cout], within ±MaxWeight(cin)
  const int32_t* centre;    // [taps, cout]: 128 · Σ_c W[k, c, o]
  const float* w_scale;     // [taps, cout]
};

// X's code: x · (1 / x_scale) in float, clamped to [0, 255] (NaN → 0), rounded half to even.
SL_HD inline uint8_t Code(float x, float inverse) {
  float v = x * inverse;
  v = v > 0.0f ? v : 0.0f;
  v = v < kTopCode ? v : kTopCode;
  return static_cast<uint8_t>(rintf(v));
}

// 128 · Σ_c W[k, c, o]: what the centred codes leave out of tap k's sum in column o.
SL_HD inline int32_t CentreOf(const int8_t* w, int64_t cin, int64_t cout, int64_t k, int64_t o) {
  int32_t sum = 0;
  for (int64_t c = 0; c < cin; ++c) sum += w[(k * cin + c) * cout + o];
  return kCodeCentre * sum;
}

SL_HD inline bool ValidScale(float v) { return v > 0.0f && v <= 3.402823466e+38f; }  // finite and positive
SL_HD inline bool ValidWeight(int8_t v, int most) { return v >= -most && v <= most; }

// The accumulators of one thread: tile elements t, t + kInt8Threads, … (row e / kTileCols, column e % kTileCols).
struct Int8Accumulators {
  float v[kInt8PerThread];
};

SL_HD inline int Int8Element(int t, int i) { return t + i * kInt8Threads; }

// Before the first tap: the bias (0 without one).
SL_HD inline void StartInt8(const Int8ConvArgs& a, int64_t first_col, int t, Int8Accumulators& acc) {
  for (int i = 0; i < kInt8PerThread; ++i) {
    const int64_t o = first_col + Int8Element(t, i) % kTileCols;
    acc.v[i] = a.conv.bias != nullptr && o < a.conv.cout ? a.conv.bias[o] : 0.0f;
  }
}

// Phase 3: thread t loads its share of the slice (channels c0 …): the rows' centred codes row-major
// [rows × depth] (a missing input's codes are 0, so −128; past Cin 0 against a zero weight), and W
// column-major [cols × depth], as the fragments read them.
SL_HD inline void LoadInt8Slice(const Int8ConvArgs& a, const TileSources& s, int64_t k, int64_t c0, int64_t first_col,
                                int t, int8_t* x, int8_t* w) {
  const int64_t cin = a.conv.cin, cout = a.conv.cout;
  for (int e = t; e < kTileRows * kTileDepth; e += kInt8Threads) {
    const int r = e / kTileDepth, cc = e % kTileDepth;
    const int64_t c = c0 + cc, source = s.row[r];
    const int32_t code = source >= 0 && c < cin ? a.q[source * cin + c] : 0;
    x[r * kTileDepth + cc] = static_cast<int8_t>(c < cin ? code - kCodeCentre : 0);
  }
  for (int e = t; e < kTileCols * kTileDepth; e += kInt8Threads) {
    const int n = e / kTileDepth, cc = e % kTileDepth;
    const int64_t c = c0 + cc, o = first_col + n;
    w[n * kTileDepth + cc] = c < cin && o < cout ? a.w[(k * cin + c) * cout + o] : int8_t{0};
  }
}

// After tap k's slices: thread t adds each of its elements' sum (the fragments stored it to `sums`,
// [rows × kTileLead]) with the tap's scale, where its row has an input through k.
SL_HD inline void AddInt8Tap(const Int8ConvArgs& a, const TileSources& s, int64_t k, int64_t first_col, int t,
                             const int32_t* sums, Int8Accumulators& acc) {
  for (int i = 0; i < kInt8PerThread; ++i) {
    const int e = Int8Element(t, i), r = e / kTileCols, n = e % kTileCols;
    const int64_t o = first_col + n;
    if (s.row[r] < 0 || o >= a.conv.cout) continue;
    const int64_t at = k * a.conv.cout + o;
    acc.v[i] = fmaf(static_cast<float>(sums[r * kTileLead + n] + a.centre[at]), a.w_scale[at], acc.v[i]);
  }
}

// Last: thread t writes its elements of Y through the epilogue (+ R, then the ReLU).
SL_HD inline void StoreInt8(const Int8ConvArgs& a, int64_t first_row, int64_t first_col, int t,
                            const Int8Accumulators& acc) {
  for (int i = 0; i < kInt8PerThread; ++i) {
    const int e = Int8Element(t, i);
    const int64_t m = first_row + e / kTileCols, o = first_col + e % kTileCols;
    if (m < a.conv.rows && o < a.conv.cout) a.conv.y[m * a.conv.cout + o] = Finish(a.conv, m, o, acc.v[i]);
  }
}

}  // namespace bodies
}  // namespace sparse_lower
