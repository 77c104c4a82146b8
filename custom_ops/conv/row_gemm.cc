#include "conv/row_gemm.h"

#include <algorithm>

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics initialise their undefined operands from themselves (`__m512 __Y = __Y;`),
// which -Wmaybe-uninitialized reports at every inlined use (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

#include "common/vector_units.h"
#include "conv/neon_rows.h"
#include "conv/row_tiles.h"

namespace sparse_lower {
namespace {

// Rows are taken kTileRows (conv/row_tiles.h) at a time: 6 rows × 16 columns fill 12 of the 16 AVX2
// registers with accumulators, leaving room for two weight vectors and one broadcast input.
constexpr int kTileColumns = 16;

// Columns [o, o + width) of rows [0, n), n ≤ kTileRows, on any CPU.
void PortableTile(const float* const* a, float* const* y, int n, int64_t cin, const float* w, int64_t cout, int64_t o,
                  int64_t width) {
  for (int i = 0; i < n; ++i) {
    float acc[kTileColumns] = {};
    for (int64_t c = 0; c < cin; ++c) {
      const float value = a[i][c];
      const float* row = w + c * cout + o;
      for (int64_t j = 0; j < width; ++j) acc[j] += value * row[j];
    }
    for (int64_t j = 0; j < width; ++j) y[i][o + j] += acc[j];
  }
}

void PortableRows(const float* const* a, float* const* y, int64_t n, int64_t cin, const float* w, int64_t cout) {
  for (int64_t i = 0; i < n; i += kTileRows) {
    const int rows = static_cast<int>(n - i < kTileRows ? n - i : kTileRows);
    for (int64_t o = 0; o < cout; o += kTileColumns) {
      PortableTile(a + i, y + i, rows, cin, w, cout, o, cout - o < kTileColumns ? cout - o : kTileColumns);
    }
  }
}

#if defined(__x86_64__)
// Columns [o, o + 8·kVectors) of kRows rows, kVectors 1 or 2: broadcast a[i][c] and multiply-add it
// with the weight row. Always inlined: inside its caller GCC keeps the 12 accumulators in registers, while
// as a function of its own (GCC 12) it stores them to the stack at every step, at 40 % of the speed.
template <int kRows, int kVectors>
__attribute__((target("avx2,fma"), always_inline)) inline void VectorTile(const float* const* a, float* const* y,
                                                                         int64_t cin, const float* w, int64_t cout,
                                                                         int64_t o) {
  static_assert(kVectors == 1 || kVectors == 2, "a tile is 8 or 16 columns wide");
  __m256 acc[kRows][2];
  for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t c = 0; c < cin; ++c) {
    const __m256 low = _mm256_loadu_ps(w + c * cout + o);
    const __m256 high = kVectors == 2 ? _mm256_loadu_ps(w + c * cout + o + 8) : low;
    for (int i = 0; i < kRows; ++i) {
      const __m256 value = _mm256_broadcast_ss(a[i] + c);
      acc[i][0] = _mm256_fmadd_ps(value, low, acc[i][0]);
      if constexpr (kVectors == 2) acc[i][1] = _mm256_fmadd_ps(value, high, acc[i][1]);
    }
  }
  for (int i = 0; i < kRows; ++i) {
    float* out = y[i] + o;
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_loadu_ps(out), acc[i][0]));
    if constexpr (kVectors == 2) _mm256_storeu_ps(out + 8, _mm256_add_ps(_mm256_loadu_ps(out + 8), acc[i][1]));
  }
}

// Columns [o, cout) of kRows rows one by one, with FMA as the tiles (so a column's sum is formed the same
// way wherever it falls).
template <int kRows>
__attribute__((target("avx2,fma"), always_inline)) inline void RemainingColumns(const float* const* a, float* const* y,
                                                                               int64_t cin, const float* w,
                                                                               int64_t cout, int64_t o) {
  for (; o < cout; ++o) {
    for (int i = 0; i < kRows; ++i) {
      float sum = 0.0f;
      for (int64_t c = 0; c < cin; ++c) sum = __builtin_fmaf(a[i][c], w[c * cout + o], sum);
      y[i][o] += sum;
    }
  }
}

// All columns of kRows rows: 16 at a time, then 8, then the rest one by one.
template <int kRows>
__attribute__((target("avx2,fma"))) void VectorRows(const float* const* a, float* const* y, int64_t cin,
                                                    const float* w, int64_t cout) {
  int64_t o = 0;
  for (; o + 16 <= cout; o += 16) VectorTile<kRows, 2>(a, y, cin, w, cout, o);
  if (o + 8 <= cout) {
    VectorTile<kRows, 1>(a, y, cin, w, cout, o);
    o += 8;
  }
  RemainingColumns<kRows>(a, y, cin, w, cout, o);
}

// The AVX2 tile at twice the width, in AVX-512 registers: columns [o, o + 16·kVectors), kVectors 1 or 2.
// Each column's sum is formed by the same FMAs in the same order, so the result is the same bits. A tile
// of its own rather than VectorTile over a register type: a function's target cannot depend on a template
// argument, and an AVX2 tile compiled for AVX-512 could take AVX-512 instructions onto AVX2-only CPUs.
template <int kRows, int kVectors>
__attribute__((target("avx2,fma,avx512f"), always_inline)) inline void WideTile(const float* const* a, float* const* y,
                                                                               int64_t cin, const float* w,
                                                                               int64_t cout, int64_t o) {
  static_assert(kVectors == 1 || kVectors == 2, "a wide tile is 16 or 32 columns wide");
  __m512 acc[kRows][2];
  for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t c = 0; c < cin; ++c) {
    const __m512 low = _mm512_loadu_ps(w + c * cout + o);
    const __m512 high = kVectors == 2 ? _mm512_loadu_ps(w + c * cout + o + 16) : low;
    for (int i = 0; i < kRows; ++i) {
      const __m512 value = _mm512_set1_ps(a[i][c]);
      acc[i][0] = _mm512_fmadd_ps(value, low, acc[i][0]);
      if constexpr (kVectors == 2) acc[i][1] = _mm512_fmadd_ps(value, high, acc[i][1]);
    }
  }
  for (int i = 0; i < kRows; ++i) {
    float* out = y[i] + o;
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(out), acc[i][0]));
    if constexpr (kVectors == 2) _mm512_storeu_ps(out + 16, _mm512_add_ps(_mm512_loadu_ps(out + 16), acc[i][1]));
  }
}

// All columns of kRows rows with AVX-512: 32 at a time, then 16, then the AVX2 tile's 8, then the rest.
template <int kRows>
__attribute__((target("avx2,fma,avx512f"))) void WideRows(const float* const* a, float* const* y, int64_t cin,
                                                          const float* w, int64_t cout) {
  int64_t o = 0;
  for (; o + 32 <= cout; o += 32) WideTile<kRows, 2>(a, y, cin, w, cout, o);
  if (o + 16 <= cout) {
    WideTile<kRows, 1>(a, y, cin, w, cout, o);
    o += 16;
  }
  if (o + 8 <= cout) {
    VectorTile<kRows, 1>(a, y, cin, w, cout, o);
    o += 8;
  }
  RemainingColumns<kRows>(a, y, cin, w, cout, o);
}

// The AVX2 and the AVX-512 row functions, as the row driver below calls them.
struct Avx2Tiles {
  template <int kRows>
  static void Rows(const float* const* a, float* const* y, int64_t cin, const float* w, int64_t cout) {
    VectorRows<kRows>(a, y, cin, w, cout);
  }
};

struct Avx512Tiles {
  template <int kRows>
  static void Rows(const float* const* a, float* const* y, int64_t cin, const float* w, int64_t cout) {
    WideRows<kRows>(a, y, cin, w, cout);
  }
};

// n rows, tile by tile (conv/row_tiles.h).
template <typename Tiles>
void TiledRows(const float* const* a, float* const* y, int64_t n, int64_t cin, const float* w, int64_t cout) {
  ForEachRowTile(
      n,
      [&](int64_t j) {
        for (int64_t c = 0; c < cin; c += 16) _mm_prefetch(reinterpret_cast<const char*>(a[j] + c), _MM_HINT_T0);
        for (int64_t o = 0; o < cout; o += 16) _mm_prefetch(reinterpret_cast<const char*>(y[j] + o), _MM_HINT_T0);
      },
      [&](auto rows, int64_t i) { Tiles::template Rows<decltype(rows)::value>(a + i, y + i, cin, w, cout); });
}

#endif

}  // namespace

void AccumulateRows(const float* const* a, float* const* y, int64_t n, int64_t cin, const float* w, int64_t cout) {
#if defined(__x86_64__)
  if (HasAvx512()) {
    TiledRows<Avx512Tiles>(a, y, n, cin, w, cout);
    return;
  }
  if (HasVectorUnits()) {
    TiledRows<Avx2Tiles>(a, y, n, cin, w, cout);
    return;
  }
#elif defined(__aarch64__)
  if (HasNeon()) {
    NeonRows(a, y, n, cin, w, cout);
    return;
  }
#endif
  PortableRows(a, y, n, cin, w, cout);
}

}  // namespace sparse_lower
