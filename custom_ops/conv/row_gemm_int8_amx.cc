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
constexpr int kRowBytes = 64;   // bytes of a tile row: 64 channels of an input row, or one quad's 16 columns × 4
constexpr int kMostPairs = 4;   // tiles of sums: tiles 0-3; tile 4 holds the rows, tiles 5 and 6 the weights

// The operand of ldtilecfg (palette 1): each tile's rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t bytes[16];
  uint8_t rows[16];
};

__attribute__((target("amx-tile"))) void ConfigureTiles() {
  TileConfig config{};
  config.palette = 1;
  for (int t = 0; t < 7; ++t) {
    config.bytes[t] = kRowBytes;
    config.rows[t] = kRows;
  }
  _tile_loadconfig(&config);
}

// The int32 sums of 16 rows (`rows`, `stride` bytes apart, Chunks() · 64 channels each) with kPairs tiles of
// 16 columns from pair `first`, into sums [kPairs][16][16]. The weights alternate between tiles 5 and 6,
// so that one loads while the other multiplies.
template <int kPairs>
__attribute__((target("amx-tile,amx-int8"))) void MultiplyTiles(const uint8_t* rows, int64_t stride,
                                                                const PackedWeights& w, int64_t first,
                                                                int32_t* sums) {
  static_assert(kPairs >= 1 && kPairs <= kMostPairs, "1 to 4 tiles of sums");
  _tile_zero(0);
  if constexpr (kPairs > 1) _tile_zero(1);
  if constexpr (kPairs > 2) _tile_zero(2);
  if constexpr (kPairs > 3) _tile_zero(3);
  for (int64_t chunk = 0; chunk < w.Chunks(); ++chunk) {
    _tile_loadd(4, rows + chunk * kRowBytes, stride);
    _tile_loadd(5, w.Tile(first, chunk), kRowBytes);
    _tile_dpbusd(0, 4, 5);
    if constexpr (kPairs > 1) {
      _tile_loadd(6, w.Tile(first + 1, chunk), kRowBytes);
      _tile_dpbusd(1, 4, 6);
    }
    if constexpr (kPairs > 2) {
      _tile_loadd(5, w.Tile(first + 2, chunk), kRowBytes);
      _tile_dpbusd(2, 4, 5);
    }
    if constexpr (kPairs > 3) {
      _tile_loadd(6, w.Tile(first + 3, chunk), kRowBytes);
      _tile_dpbusd(3, 4, 6);
    }
  }
  _tile_stored(0, sums, kRowBytes);
  if constexpr (kPairs > 1) _tile_stored(1, sums + kRows * 16, kRowBytes);
  if constexpr (kPairs > 2) _tile_stored(2, sums + 2 * kRows * 16, kRowBytes);
  if constexpr (kPairs > 3) _tile_stored(3, sums + 3 * kRows * 16, kRowBytes);
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

}  // namespace

__attribute__((target("amx-tile"))) void AmxRowsInt8(const uint8_t* const* a, float* const* y, int64_t n,
                                                     const PackedWeights& w, const float* scale, int64_t cout) {
  const int64_t pairs = (cout + 15) / 16;  // tiles of 16 columns (the packing's pairs of 8-column blocks)
  const int64_t stride = w.Chunks() * kRowBytes;
  const int64_t bytes = 4 * w.Quads();  // PackedWeights::RowBytes(Cin): what each input row holds
  // The rows of a tile, one after another; the bytes past each row's own stay zero (its padding to whole
  // chunks), while rows past the last tile's m keep an earlier tile's rows, whose sums are not used.
  thread_local std::vector<uint8_t> block;
  block.assign(static_cast<size_t>(kRows * stride), 0);
  alignas(64) int32_t sums[kMostPairs * kRows * 16];
  ConfigureTiles();
  for (int64_t i = 0; i < n; i += kRows) {
    const int m = static_cast<int>(std::min<int64_t>(kRows, n - i));
    for (int r = 0; r < m; ++r) std::memcpy(block.data() + r * stride, a[i + r], static_cast<size_t>(bytes));
    for (int64_t first = 0; first < pairs; first += kMostPairs) {
      const int64_t count = std::min<int64_t>(kMostPairs, pairs - first);
      switch (count) {
        case 1: MultiplyTiles<1>(block.data(), stride, w, first, sums); break;
        case 2: MultiplyTiles<2>(block.data(), stride, w, first, sums); break;
        case 3: MultiplyTiles<3>(block.data(), stride, w, first, sums); break;
        default: MultiplyTiles<4>(block.data(), stride, w, first, sums); break;
      }
      AddScaled(y + i, m, sums, first, count, scale, cout);
    }
  }
  _tile_release();
}

}  // namespace sparse_lower

#endif
