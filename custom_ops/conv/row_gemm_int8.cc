#include "conv/row_gemm_int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics initialise their undefined operands from themselves (`__m512i __Y = __Y;`),
// which -Wmaybe-uninitialized reports at every inlined use (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

#include "common/vector_units.h"
#include "conv/amx_rows.h"
#include "conv/neon_rows.h"
#include "conv/row_tiles.h"

namespace sparse_lower {
namespace {

// AMX takes layers of at least this many input channels; narrower ones stay on VNNI. On the CenterPoint
// backbone (Xeon, one thread) AMX took its 16- and 32-channel layers 1.2-1.4x longer than VNNI with 64-channel
// chunks, and its 32-channel ones still 1.07x longer with 32-channel chunks (a tile of each row's 32 bytes:
// the copy into the block and the sums' way back through memory cost more than the products save), its
// 64- and 128-channel layers 1.1-1.8x less long.
constexpr int64_t kAmxLeastChannels = 64;

int64_t Blocks(int64_t cout) { return (cout + 7) / 8; }
// Pairs of blocks (the VNNI tile's 16 columns); the packed weights hold whole pairs, the last block of an
// odd count followed by a block of zeros.
int64_t Pairs(int64_t cout) { return (Blocks(cout) + 1) / 2; }

// Columns [8·block, 8·block + 8) ∩ [0, cout) of row i, on any CPU (weights in quads: the portable loops
// run only where I8MM is not used, so the packing is never in octets here).
void PortableBlock(const uint8_t* a, float* y, const int8_t* packed, int64_t quads, const float* scale, int64_t block,
                   int64_t cout) {
  for (int64_t j = 0; j < 8 && 8 * block + j < cout; ++j) {
    int32_t sum = 0;
    for (int64_t q = 0; q < quads; ++q) {
      for (int t = 0; t < 4; ++t) sum += int32_t{a[4 * q + t]} * packed[q * 32 + j * 4 + t];
    }
    const int64_t o = 8 * block + j;
    y[o] = std::fma(static_cast<float>(sum), scale[o], y[o]);
  }
}

#if defined(__x86_64__)
// kRows rows × kBlocks (1 or 2) blocks of 8 columns: per quad of input channels, each row's 4 bytes are
// broadcast, multiplied with the 8 columns' 4 weights (vpmaddubsw: pairs summed to int16) and summed to
// int32 per column (vpmaddwd with ones). Always inlined, as VectorTile in conv/row_gemm.cc, for the
// accumulators to stay in registers.
template <int kRows, int kBlocks>
__attribute__((target("avx2,fma"), always_inline)) inline void Int8Tile(const uint8_t* const* a, float* const* y,
                                                                       const PackedWeights& w, const float* scale,
                                                                       int64_t block, int64_t cout) {
  const int64_t quads = w.Quads();
  const int8_t* first = w.Block(block);
  const int8_t* second = w.Block(block + kBlocks - 1);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[kRows][2];
  for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
  for (int64_t q = 0; q < quads; ++q) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + q * 32));
    const __m256i w1 = kBlocks == 2 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(second + q * 32)) : w0;
    for (int i = 0; i < kRows; ++i) {
      int32_t quad;
      std::memcpy(&quad, a[i] + 4 * q, sizeof quad);
      const __m256i x = _mm256_set1_epi32(quad);
      acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(_mm256_maddubs_epi16(x, w0), ones));
      if constexpr (kBlocks == 2) {
        acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(_mm256_maddubs_epi16(x, w1), ones));
      }
    }
  }
  for (int b = 0; b < kBlocks; ++b) {
    const int64_t o = 8 * (block + b);
    if (o + 8 <= cout) {
      const __m256 s = _mm256_loadu_ps(scale + o);
      for (int i = 0; i < kRows; ++i) {
        float* out = y[i] + o;
        _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][b]), s, _mm256_loadu_ps(out)));
      }
    } else {  // the last, partial block: its padded columns are zero weights, left out here
      for (int i = 0; i < kRows; ++i) {
        alignas(32) int32_t sums[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(sums), acc[i][b]);
        for (int64_t j = 0; o + j < cout; ++j) {
          y[i][o + j] = std::fma(static_cast<float>(sums[j]), scale[o + j], y[i][o + j]);
        }
      }
    }
  }
}

template <int kRows>
__attribute__((target("avx2,fma"))) void Int8Rows(const uint8_t* const* a, float* const* y, const PackedWeights& w,
                                                  const float* scale, int64_t cout) {
  const int64_t blocks = Blocks(cout);
  int64_t block = 0;
  for (; block + 2 <= blocks; block += 2) Int8Tile<kRows, 2>(a, y, w, scale, block, cout);
  if (block < blocks) Int8Tile<kRows, 1>(a, y, w, scale, block, cout);
}

// The AVX-512 VNNI tile: kRows rows × 16·kPairs columns (kPairs = 1 or 2 pairs of 8-column blocks, one
// zmm each). Per quad of input channels, vpdpbusd multiplies each row's 4 broadcast bytes with the 16
// columns' 4 weights and adds the 4 products to the column's int32 sum in one instruction: no int16 step,
// the same exact sums as the AVX2 tile, so the same bits after the same scale-and-add. Apart from Int8Tile
// for the reason given at conv/row_gemm.cc's WideTile: each function's target is fixed.
template <int kRows, int kPairs>
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vnni"), always_inline)) inline void VnniTile(
    const uint8_t* const* a, float* const* y, const PackedWeights& w, const float* scale, int64_t block,
    int64_t cout) {
  const int64_t quads = w.Quads();
  __m512i acc[kRows][kPairs];
  for (int i = 0; i < kRows; ++i) {
    for (int p = 0; p < kPairs; ++p) acc[i][p] = _mm512_setzero_si512();
  }
  for (int64_t q = 0; q < quads; ++q) {
    __m512i weights[kPairs];
    for (int p = 0; p < kPairs; ++p) {  // blocks block + 2p and block + 2p + 1 (zeros past the last: see Pairs)
      const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.Block(block + 2 * p) + q * 32));
      const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.Block(block + 2 * p + 1) + q * 32));
      weights[p] = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
    }
    for (int i = 0; i < kRows; ++i) {
      int32_t quad;
      std::memcpy(&quad, a[i] + 4 * q, sizeof quad);
      const __m512i x = _mm512_set1_epi32(quad);
      for (int p = 0; p < kPairs; ++p) acc[i][p] = _mm512_dpbusd_epi32(acc[i][p], x, weights[p]);
    }
  }
  for (int p = 0; p < kPairs; ++p) {
    const int64_t o = 8 * (block + 2 * p);
    if (o + 16 <= cout) {
      const __m512 s = _mm512_loadu_ps(scale + o);
      for (int i = 0; i < kRows; ++i) {
        float* out = y[i] + o;
        _mm512_storeu_ps(out, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][p]), s, _mm512_loadu_ps(out)));
      }
    } else {  // the last, partial pair: its padded columns are zero weights, left out here
      for (int i = 0; i < kRows; ++i) {
        alignas(64) int32_t sums[16];
        _mm512_store_si512(sums, acc[i][p]);
        for (int64_t j = 0; o + j < cout; ++j) {
          y[i][o + j] = std::fma(static_cast<float>(sums[j]), scale[o + j], y[i][o + j]);
        }
      }
    }
  }
}

template <int kRows>
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vnni"))) void VnniRows(
    const uint8_t* const* a, float* const* y, const PackedWeights& w, const float* scale, int64_t cout) {
  const int64_t pairs = Pairs(cout);
  int64_t pair = 0;
  for (; pair + 2 <= pairs; pair += 2) VnniTile<kRows, 2>(a, y, w, scale, 2 * pair, cout);
  if (pair < pairs) VnniTile<kRows, 1>(a, y, w, scale, 2 * pair, cout);
}

// The AVX2 and the VNNI tiles, as the row driver below calls them.
struct Avx2Tiles {
  template <int kRows>
  static void Rows(const uint8_t* const* a, float* const* y, const PackedWeights& w, const float* scale, int64_t cout) {
    Int8Rows<kRows>(a, y, w, scale, cout);
  }
};

struct VnniTiles {
  template <int kRows>
  static void Rows(const uint8_t* const* a, float* const* y, const PackedWeights& w, const float* scale, int64_t cout) {
    VnniRows<kRows>(a, y, w, scale, cout);
  }
};

// n rows, tile by tile (conv/row_tiles.h).
template <typename Tiles>
void VectorRowsInt8(const uint8_t* const* a, float* const* y, int64_t n, const PackedWeights& w, const float* scale,
                    int64_t cout) {
  ForEachRowTile(
      n,
      [&](int64_t j) {
        for (int64_t c = 0; c < 4 * w.Quads(); c += 64) _mm_prefetch(reinterpret_cast<const char*>(a[j] + c), _MM_HINT_T0);
        for (int64_t o = 0; o < cout; o += 16) _mm_prefetch(reinterpret_cast<const char*>(y[j] + o), _MM_HINT_T0);
      },
      [&](auto rows, int64_t i) { Tiles::template Rows<decltype(rows)::value>(a + i, y + i, w, scale, cout); });
}

#endif

}  // namespace

PackedWeights::PackedWeights(const int8_t* w, int64_t cin, int64_t cout)
    : layout_(HasAmx() && cin >= kAmxLeastChannels ? Layout::kTiles
              : HasI8mm()                          ? Layout::kOctets
                                                   : Layout::kQuads),
      quads_(RowBytes(cin) / 4),
      bytes_(static_cast<size_t>(Pairs(cout) * (layout_ == Layout::kTiles ? Chunks() * Depth() : quads_) * 64), 0),
      offsets_(static_cast<size_t>(16 * Pairs(cout)), 0) {
  for (int64_t c = 0; c < cin; ++c) {
    for (int64_t o = 0; o < cout; ++o) {
      const int64_t j = o % 8;
      const int64_t at = layout_ == Layout::kTiles
                             ? ((o / 16 * Chunks() + c / 4 / Depth()) * Depth() + c / 4 % Depth()) * 64 + (o % 16) * 4 +
                                   c % 4
                         : layout_ == Layout::kQuads ? (o / 8) * quads_ * 32 + (c / 4) * 32 + j * 4 + c % 4
                                                     : (o / 8) * quads_ * 32 + (c / 8) * 64 + (j / 2) * 16 +
                                                           (j % 2) * 8 + c % 8;
      bytes_[static_cast<size_t>(at)] = w[c * cout + o];
      offsets_[static_cast<size_t>(o)] += 128 * int32_t{w[c * cout + o]};
      wide_ |= w[c * cout + o] > 63 || w[c * cout + o] < -63;
    }
  }
}

void AccumulateRowsInt8(const uint8_t* const* a, float* const* y, int64_t n, const PackedWeights& w, const float* scale,
                        int64_t cout) {
#if defined(__x86_64__)
  if (w.Packing() == PackedWeights::Layout::kTiles) {
    AmxRowsInt8(a, y, n, w, scale, cout);
    return;
  }
  if (HasVnni()) {
    VectorRowsInt8<VnniTiles>(a, y, n, w, scale, cout);
    return;
  }
  if (HasVectorUnits() && !w.Wide()) {
    VectorRowsInt8<Avx2Tiles>(a, y, n, w, scale, cout);
    return;
  }
#elif defined(__aarch64__)
  if (HasI8mm()) {
    MmlaRowsInt8(a, y, n, w, scale, cout);
    return;
  }
  if (HasDotProd()) {
    DotRowsInt8(a, y, n, w, scale, cout);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t block = 0; block < Blocks(cout); ++block) {
      PortableBlock(a[i], y[i], w.Block(block), w.Quads(), scale, block, cout);
    }
  }
}

}  // namespace sparse_lower
