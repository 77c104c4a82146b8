#include "conv/amx_rows.h"

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics: see conv/row_gemm_int8.cc.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace sparse_lower {
namespace {

constexpr int kRows = 16;       // rows of a tile
constexpr int kRowBytes = 64;   // bytes of a tile row of sums (16 columns), or of weights: a quad's (pair's)
                                // 16 columns × 4 u8 (× 2 bf16)
constexpr int kMostPairs = 4;   // tiles of sums: tiles 0-3; tile 4 holds the rows, tiles 5 and 6 the weights

// The operand of ldtilecfg (palette 1): each tile's rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t bytes[16];
  uint8_t rows[16];
};

// Tiles 0-3 (sums) 16 rows of 64 bytes, tile 4 (the rows) 16 rows of `depth` · 4 bytes (a chunk of each
// input row), tiles 5 and 6 (weights) `depth` rows of 64 bytes.
__attribute__((target("amx-tile"))) void ConfigureTiles(int64_t depth) {
  TileConfig config{};
  config.palette = 1;
  for (int t = 0; t < 7; ++t) {
    config.bytes[t] = t == 4 ? static_cast<uint16_t>(4 * depth) : kRowBytes;
    config.rows[t] = t >= 5 ? static_cast<uint8_t>(depth) : kRows;
  }
  _tile_loadconfig(&config);
}

// The sums of 16 rows (`rows`, `stride` bytes apart, Chunks() · Depth() · 4 bytes each) with kPairs tiles of 16
// columns from pair `first` of `w` (PackedWeights or Bf16Weights: Tile(pair, chunk)), into sums
// [kPairs][16][16]: int32 by tdpbusd, or float32 by tdpbf16ps (kBf16). The weights alternate between
// tiles 5 and 6, so that one loads while the other multiplies.
template <int kPairs, bool kBf16, typename Weights>
__attribute__((target("amx-tile,amx-int8,amx-bf16"))) void MultiplyTiles(const uint8_t* rows, int64_t stride,
                                                                         const Weights& w, int64_t first,
                                                                         void* sums) {
  static_assert(kPairs >= 1 && kPairs <= kMostPairs, "1 to 4 tiles of sums");
  auto* out = static_cast<uint8_t*>(sums);
  _tile_zero(0);
  if constexpr (kPairs > 1) _tile_zero(1);
  if constexpr (kPairs > 2) _tile_zero(2);
  if constexpr (kPairs > 3) _tile_zero(3);
  for (int64_t chunk = 0; chunk < w.Chunks(); ++chunk) {
    _tile_loadd(4, rows + chunk * 4 * w.Depth(), stride);
    _tile_loadd(5, w.Tile(first, chunk), kRowBytes);
    if constexpr (kBf16) _tile_dpbf16ps(0, 4, 5); else _tile_dpbusd(0, 4, 5);
    if constexpr (kPairs > 1) {
      _tile_loadd(6, w.Tile(first + 1, chunk), kRowBytes);
      if constexpr (kBf16) _tile_dpbf16ps(1, 4, 6); else _tile_dpbusd(1, 4, 6);
    }
    if constexpr (kPairs > 2) {
      _tile_loadd(5, w.Tile(first + 2, chunk), kRowBytes);
      if constexpr (kBf16) _tile_dpbf16ps(2, 4, 5); else _tile_dpbusd(2, 4, 5);
    }
    if constexpr (kPairs > 3) {
      _tile_loadd(6, w.Tile(first + 3, chunk), kRowBytes);
      if constexpr (kBf16) _tile_dpbf16ps(3, 4, 6); else _tile_dpbusd(3, 4, 6);
    }
  }
  _tile_stored(0, out, kRowBytes);
  if constexpr (kPairs > 1) _tile_stored(1, out + kRows * kRowBytes, kRowBytes);
  if constexpr (kPairs > 2) _tile_stored(2, out + 2 * kRows * kRowBytes, kRowBytes);
  if constexpr (kPairs > 3) _tile_stored(3, out + 3 * kRows * kRowBytes, kRowBytes);
}

// y[i][o] += scale[o] · sums for rows [0, m) and the `pairs` tiles' columns below cout: the VNNI tile's
// scale-and-add (conv/row_gemm_int8.cc), the same FMA per value.
__attribute__((target("avx2,fma,avx512f"))) void AddScaled(float* const* y, int m, const int32_t* sums,
                                                           int64_t first, int64_t pairs, const float* scale,
                                                           int64_t cout) {
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t o = 16 * (first + p);
    for (int i = 0; i < m; ++i) {
      const int32_t* row = sums + (p * kRows + i) * 16;
      float* out = y[i] + o;
      if (o + 16 <= cout) {
        const __m512 sum = _mm512_cvtepi32_ps(_mm512_loadu_si512(row));
        _mm512_storeu_ps(out, _mm512_fmadd_ps(sum, _mm512_loadu_ps(scale + o), _mm512_loadu_ps(out)));
      } else {  // the last, partial tile: its padded columns are zero weights, left out here
        for (int64_t j = 0; o + j < cout; ++j) out[j] = std::fma(static_cast<float>(row[j]), scale[o + j], out[j]);
      }
    }
  }
}

// y[i][o] += sums for rows [0, m) and the `pairs` tiles' columns below cout.
__attribute__((target("avx2,fma,avx512f"))) void AddSums(float* const* y, int m, const float* sums, int64_t first,
                                                         int64_t pairs, int64_t cout) {
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t o = 16 * (first + p);
    for (int i = 0; i < m; ++i) {
      const float* row = sums + (p * kRows + i) * 16;
      float* out = y[i] + o;
      if (o + 16 <= cout) {
        _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(row), _mm512_loadu_ps(out)));
      } else {
        for (int64_t j = 0; o + j < cout; ++j) out[j] += row[j];
      }
    }
  }
}

// n rows `bytes` long each (a[i]), 16 at a time: copied into one block of `stride`-byte rows (the bytes
// past each row's own stay zero: its padding to whole chunks; rows past the last tile's m keep an
// earlier tile's rows, whose sums are not used), multiplied with every tile of columns, and each tile's
// sums added into y[i] by add(y + i, m, sums, first, count).
template <bool kBf16, typename Weights, typename Add>
__attribute__((target("amx-tile"))) void TiledRows(const uint8_t* const* a, int64_t n, int64_t bytes,
                                                   const Weights& w, int64_t cout, Add add) {
  const int64_t pairs = (cout + 15) / 16;  // tiles of 16 columns (the packings' pairs of 8-column blocks)
  const int64_t stride = w.Chunks() * w.Depth() * 4;
  thread_local std::vector<uint8_t> block;
  block.assign(static_cast<size_t>(kRows * stride), 0);
  alignas(64) uint8_t sums[kMostPairs * kRows * kRowBytes];
  ConfigureTiles(w.Depth());
  for (int64_t i = 0; i < n; i += kRows) {
    const int m = static_cast<int>(std::min<int64_t>(kRows, n - i));
    for (int r = 0; r < m; ++r) std::memcpy(block.data() + r * stride, a[i + r], static_cast<size_t>(bytes));
    for (int64_t first = 0; first < pairs; first += kMostPairs) {
      const int64_t count = std::min<int64_t>(kMostPairs, pairs - first);
      switch (count) {
        case 1: MultiplyTiles<1, kBf16>(block.data(), stride, w, first, sums); break;
        case 2: MultiplyTiles<2, kBf16>(block.data(), stride, w, first, sums); break;
        case 3: MultiplyTiles<3, kBf16>(block.data(), stride, w, first, sums); break;
        default: MultiplyTiles<4, kBf16>(block.data(), stride, w, first, sums); break;
      }
      add(i, m, sums, first, count);
    }
  }
  _tile_release();
}

}  // namespace

void AmxRowsInt8(const uint8_t* const* a, float* const* y, int64_t n, const PackedWeights& w, const float* scale,
                 int64_t cout) {
  TiledRows<false>(a, n, 4 * w.Quads(), w, cout, [&](int64_t i, int m, const void* sums, int64_t first, int64_t count) {
    AddScaled(y + i, m, static_cast<const int32_t*>(sums), first, count, scale, cout);
  });
}

void AmxRowsBf16(const uint16_t* const* a, float* const* y, int64_t n, int64_t cin, const Bf16Weights& w,
                 int64_t cout) {
  TiledRows<true>(reinterpret_cast<const uint8_t* const*>(a), n, 2 * cin, w, cout,
                  [&](int64_t i, int m, const void* sums, int64_t first, int64_t count) {
                    AddSums(y + i, m, static_cast<const float*>(sums), first, count, cout);
                  });
}

}  // namespace sparse_lower

#endif
