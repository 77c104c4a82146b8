// AccumulateRowsInt8 on aarch64 by SDOT and by USMMLA (conv/neon_rows.h).
#include "conv/neon_rows.h"

#if defined(__aarch64__)

#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "conv/row_tiles.h"

namespace sparse_lower {
namespace {

// Row i's int32 sums of columns [o, o + 4·count) added to y as the x86 paths do: converted to float
// (exactly: below 2^24), multiplied by the column's scale and added with one rounding; the columns at or
// past cout (zero weights in the packing) are left out.
inline void FinishColumns(const int32x4_t* sums, int count, float* y, const float* scale, int64_t o, int64_t cout) {
  for (int v = 0; v < count; ++v, o += 4) {
    if (o + 4 <= cout) {
      vst1q_f32(y + o, vfmaq_f32(vld1q_f32(y + o), vcvtq_f32_s32(sums[v]), vld1q_f32(scale + o)));
    } else {
      int32_t lanes[4];
      vst1q_s32(lanes, sums[v]);
      for (int64_t j = 0; o + j < cout; ++j) y[o + j] = std::fma(static_cast<float>(lanes[j]), scale[o + j], y[o + j]);
    }
  }
}

// Quad q + kLane of kRows rows (x[i] holding row i's quads q … q + 3 as signed codes) dotted with that
// quad's weights of 8 columns (SDOT by element: the row is never broadcast into a register of its own).
template <int kLane, int kRows>
__attribute__((target("arch=armv8.2-a+dotprod"), always_inline)) inline void DotStep(int32x4_t (&acc)[kRows][2],
                                                                                    const int8x16_t (&x)[kRows],
                                                                                    const int8_t* weights) {
  const int8x16_t low = vld1q_s8(weights), high = vld1q_s8(weights + 16);
  for (int i = 0; i < kRows; ++i) {
    acc[i][0] = vdotq_laneq_s32(acc[i][0], low, x[i], kLane);
    acc[i][1] = vdotq_laneq_s32(acc[i][1], high, x[i], kLane);
  }
}

// kRows rows × one block of 8 columns. SDOT adds 4 products of signed bytes to each int32 lane, so each
// row's codes are taken as a − 128 (one EOR per 16 codes) and the offsets restore the sums of the u8
// codes. Four quads of each row are loaded at once and taken lane by lane, the last Quads() mod 4 one by
// one. 6 rows × 2 vectors of accumulators, 6 of rows and 2 of weights: 20 registers, none spilled
// (a block pair's 6 × 4 accumulators spilled in GCC 12).
template <int kRows>
__attribute__((target("arch=armv8.2-a+dotprod"), always_inline)) inline void DotTile(const uint8_t* const* a,
                                                                                    float* const* y,
                                                                                    const PackedWeights& w,
                                                                                    const float* scale, int64_t block,
                                                                                    int64_t cout) {
  const int8_t* packed = w.Block(block);
  const uint8x16_t sign = vdupq_n_u8(0x80);
  int32x4_t acc[kRows][2];
  for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = vdupq_n_s32(0);
  int64_t q = 0;
  for (; q + 4 <= w.Quads(); q += 4) {
    int8x16_t x[kRows];
    for (int i = 0; i < kRows; ++i) x[i] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(a[i] + 4 * q), sign));
    DotStep<0>(acc, x, packed + q * 32);
    DotStep<1>(acc, x, packed + (q + 1) * 32);
    DotStep<2>(acc, x, packed + (q + 2) * 32);
    DotStep<3>(acc, x, packed + (q + 3) * 32);
  }
  for (; q < w.Quads(); ++q) {
    int8x16_t x[kRows];
    for (int i = 0; i < kRows; ++i) {
      uint32_t quad;
      std::memcpy(&quad, a[i] + 4 * q, sizeof quad);
      x[i] = vreinterpretq_s8_u32(vdupq_n_u32(quad ^ 0x80808080u));
    }
    DotStep<0>(acc, x, packed + q * 32);
  }
  const int64_t o = 8 * block;
  const int32x4_t offsets[2] = {vld1q_s32(w.Offsets() + o), vld1q_s32(w.Offsets() + o + 4)};
  for (int i = 0; i < kRows; ++i) {
    for (int v = 0; v < 2; ++v) acc[i][v] = vaddq_s32(acc[i][v], offsets[v]);
    FinishColumns(acc[i], 2, y[i], scale, o, cout);
  }
}

template <int kRows>
__attribute__((target("arch=armv8.2-a+dotprod"))) void DotRows(const uint8_t* const* a, float* const* y,
                                                               const PackedWeights& w, const float* scale,
                                                               int64_t cout) {
  for (int64_t block = 0; 8 * block < cout; ++block) DotTile<kRows>(a, y, w, scale, block, cout);
}

// kRows rows × one block of 8 columns in pairs of rows: per octet of input channels, a pair's two 8-code
// rows side by side are one USMMLA operand, each pair of columns' 8 weights the other, and the 2 × 2
// int32 sums accumulate in one register. An odd last row is paired with itself and its copy dropped.
// (kRows + 1) / 2 × 4 accumulators, 4 weight vectors and the pairs' rows: at most 19 registers (two blocks
// at once, 31 registers, spilled in GCC 12).
template <int kRows>
__attribute__((target("arch=armv8.2-a+i8mm"), always_inline)) inline void MmlaTile(const uint8_t* const* a,
                                                                                  float* const* y,
                                                                                  const PackedWeights& w,
                                                                                  const float* scale, int64_t block,
                                                                                  int64_t cout) {
  constexpr int kPairs = (kRows + 1) / 2;
  const int8_t* packed = w.Block(block);
  int32x4_t acc[kPairs][4];
  for (int r = 0; r < kPairs; ++r) {
    for (int p = 0; p < 4; ++p) acc[r][p] = vdupq_n_s32(0);
  }
  for (int64_t k = 0; k < w.Quads() / 2; ++k) {
    int8x16_t weights[4];
    for (int p = 0; p < 4; ++p) weights[p] = vld1q_s8(packed + k * 64 + 16 * p);
    for (int r = 0; r < kPairs; ++r) {
      const uint8x16_t x =
          vcombine_u8(vld1_u8(a[2 * r] + 8 * k), vld1_u8(a[std::min(2 * r + 1, kRows - 1)] + 8 * k));
      for (int p = 0; p < 4; ++p) acc[r][p] = vusmmlaq_s32(acc[r][p], x, weights[p]);
    }
  }
  for (int r = 0; r < kPairs; ++r) {
    // acc[r][p] = [row 2r: columns 2p, 2p + 1 | row 2r + 1: the same]; each row's 8 columns in two vectors
    int32x4_t rows[2][2];
    for (int half = 0; half < 2; ++half) {
      const int64x2_t low = vreinterpretq_s64_s32(acc[r][2 * half]);
      const int64x2_t high = vreinterpretq_s64_s32(acc[r][2 * half + 1]);
      rows[0][half] = vreinterpretq_s32_s64(vzip1q_s64(low, high));
      rows[1][half] = vreinterpretq_s32_s64(vzip2q_s64(low, high));
    }
    FinishColumns(rows[0], 2, y[2 * r], scale, 8 * block, cout);
    if (2 * r + 1 < kRows) FinishColumns(rows[1], 2, y[2 * r + 1], scale, 8 * block, cout);
  }
}

template <int kRows>
__attribute__((target("arch=armv8.2-a+i8mm"))) void MmlaRows(const uint8_t* const* a, float* const* y,
                                                             const PackedWeights& w, const float* scale,
                                                             int64_t cout) {
  for (int64_t block = 0; 8 * block < cout; ++block) MmlaTile<kRows>(a, y, w, scale, block, cout);
}

// n rows, tile by tile (conv/row_tiles.h), with the next tile's rows prefetched.
template <typename Rows>
void TiledRows(const uint8_t* const* a, float* const* y, int64_t n, const PackedWeights& w, int64_t cout, Rows rows) {
  ForEachRowTile(
      n,
      [&](int64_t j) {
        for (int64_t c = 0; c < 4 * w.Quads(); c += 64) __builtin_prefetch(a[j] + c);
        for (int64_t o = 0; o < cout; o += 16) __builtin_prefetch(y[j] + o);
      },
      rows);
}

}  // namespace

void DotRowsInt8(const uint8_t* const* a, float* const* y, int64_t n, const PackedWeights& w, const float* scale,
                 int64_t cout) {
  TiledRows(a, y, n, w, cout,
            [&](auto rows, int64_t i) { DotRows<decltype(rows)::value>(a + i, y + i, w, scale, cout); });
}

void MmlaRowsInt8(const uint8_t* const* a, float* const* y, int64_t n, const PackedWeights& w, const float* scale,
                  int64_t cout) {
  TiledRows(a, y, n, w, cout,
            [&](auto rows, int64_t i) { MmlaRows<decltype(rows)::value>(a + i, y + i, w, scale, cout); });
}

}  // namespace sparse_lower

#endif
