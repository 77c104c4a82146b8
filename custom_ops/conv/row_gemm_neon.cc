// AccumulateRows on aarch64 by NEON's FMLA (conv/neon_rows.h).
#include "conv/neon_rows.h"

#if defined(__aarch64__)

#include <arm_neon.h>

#include "conv/row_tiles.h"

namespace sparse_lower {
namespace {

// Channel c + kLane of kRows rows (x[i] holding row i's channels c … c + 3) multiply-added with that
// channel's weights (FMLA by element: the input is never broadcast into a register of its own).
template <int kLane, int kRows, int kVectors>
__attribute__((always_inline)) inline void LaneStep(float32x4_t (&acc)[kRows][kVectors], const float32x4_t (&x)[kRows],
                                                   const float* weights) {
  float32x4_t w[kVectors];
  for (int v = 0; v < kVectors; ++v) w[v] = vld1q_f32(weights + 4 * v);
  for (int i = 0; i < kRows; ++i) {
    for (int v = 0; v < kVectors; ++v) acc[i][v] = vfmaq_laneq_f32(acc[i][v], w[v], x[i], kLane);
  }
}

// Columns [o, o + 4·kVectors) of kRows rows, kVectors 1 or 2: four channels of each row loaded at once and
// taken lane by lane, then the last Cin mod 4 channels broadcast one by one; either way a column's sum
// is the FMA chain in ascending channel order. 6 rows × 2 vectors hold 12 of the 32 registers in
// accumulators, 6 the rows' channels and 2 the weights: wider tiles (3 or 4 vectors) made GCC 12 spill
// or shuffle registers in the loop (0.37 and 0.44 instructions per multiply-add against this one's 0.35).
// Always inlined, as the x86 tiles, for the accumulators to stay in registers.
template <int kRows, int kVectors>
__attribute__((always_inline)) inline void FloatTile(const float* const* a, float* const* y, int64_t cin,
                                                     const float* w, int64_t cout, int64_t o) {
  float32x4_t acc[kRows][kVectors];
  for (int i = 0; i < kRows; ++i) {
    for (int v = 0; v < kVectors; ++v) acc[i][v] = vdupq_n_f32(0.0f);
  }
  int64_t c = 0;
  for (; c + 4 <= cin; c += 4) {
    float32x4_t x[kRows];
    for (int i = 0; i < kRows; ++i) x[i] = vld1q_f32(a[i] + c);
    LaneStep<0>(acc, x, w + c * cout + o);
    LaneStep<1>(acc, x, w + (c + 1) * cout + o);
    LaneStep<2>(acc, x, w + (c + 2) * cout + o);
    LaneStep<3>(acc, x, w + (c + 3) * cout + o);
  }
  for (; c < cin; ++c) {
    for (int i = 0; i < kRows; ++i) {
      const float32x4_t value = vld1q_dup_f32(a[i] + c);
      for (int v = 0; v < kVectors; ++v) acc[i][v] = vfmaq_f32(acc[i][v], value, vld1q_f32(w + c * cout + o + 4 * v));
    }
  }
  for (int i = 0; i < kRows; ++i) {
    for (int v = 0; v < kVectors; ++v) {
      float* out = y[i] + o + 4 * v;
      vst1q_f32(out, vaddq_f32(vld1q_f32(out), acc[i][v]));
    }
  }
}

// All columns of kRows rows: 8 at a time, then 4, then the rest one by one with the same fused chain.
template <int kRows>
void FloatRows(const float* const* a, float* const* y, int64_t cin, const float* w, int64_t cout) {
  int64_t o = 0;
  for (; o + 8 <= cout; o += 8) FloatTile<kRows, 2>(a, y, cin, w, cout, o);
  for (; o + 4 <= cout; o += 4) FloatTile<kRows, 1>(a, y, cin, w, cout, o);
  for (; o < cout; ++o) {
    for (int i = 0; i < kRows; ++i) {
      float sum = 0.0f;
      for (int64_t c = 0; c < cin; ++c) sum = __builtin_fmaf(a[i][c], w[c * cout + o], sum);
      y[i][o] += sum;
    }
  }
}

}  // namespace

void NeonRows(const float* const* a, float* const* y, int64_t n, int64_t cin, const float* w, int64_t cout) {
  ForEachRowTile(
      n,
      [&](int64_t j) {
        for (int64_t c = 0; c < cin; c += 16) __builtin_prefetch(a[j] + c);
        for (int64_t o = 0; o < cout; o += 16) __builtin_prefetch(y[j] + o);
      },
      [&](auto rows, int64_t i) { FloatRows<decltype(rows)::value>(a + i, y + i, cin, w, cout); });
}

}  // namespace sparse_lower

#endif
