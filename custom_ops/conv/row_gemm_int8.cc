#include "conv/row_gemm_int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/vector_units.h"

namespace sparse_lower {
namespace {

constexpr int kTileRows = 6;  // as in conv/row_gemm.cc: 6 rows × 16 columns of accumulators

int64_t Blocks(int64_t cout) { return (cout + 7) / 8; }

// Columns [8·block, 8·block + 8) ∩ [0, cout) of row i, on any CPU.
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

__attribute__((target("avx2,fma"))) void VectorRowsInt8(const uint8_t* const* a, float* const* y, int64_t n,
                                                        const PackedWeights& w, const float* scale, int64_t cout) {
  int64_t i = 0;
  for (; i + kTileRows <= n; i += kTileRows) {
    for (int64_t j = i + kTileRows; j < std::min(n, i + 2 * kTileRows); ++j) {  // the next tile's rows
      for (int64_t c = 0; c < 4 * w.Quads(); c += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(a[j] + c), _MM_HINT_T0);
      }
      for (int64_t o = 0; o < cout; o += 16) _mm_prefetch(reinterpret_cast<const char*>(y[j] + o), _MM_HINT_T0);
    }
    Int8Rows<kTileRows>(a + i, y + i, w, scale, cout);
  }
  switch (n - i) {
    case 5: Int8Rows<5>(a + i, y + i, w, scale, cout); break;
    case 4: Int8Rows<4>(a + i, y + i, w, scale, cout); break;
    case 3: Int8Rows<3>(a + i, y + i, w, scale, cout); break;
    case 2: Int8Rows<2>(a + i, y + i, w, scale, cout); break;
    case 1: Int8Rows<1>(a + i, y + i, w, scale, cout); break;
    default: break;
  }
}
#endif

}  // namespace

PackedWeights::PackedWeights(const int8_t* w, int64_t cin, int64_t cout)
    : quads_((cin + 3) / 4), bytes_(static_cast<size_t>(Blocks(cout) * quads_ * 32), 0) {
  for (int64_t c = 0; c < cin; ++c) {
    for (int64_t o = 0; o < cout; ++o) {
      bytes_[static_cast<size_t>(((o / 8) * quads_ + c / 4) * 32 + (o % 8) * 4 + c % 4)] = w[c * cout + o];
    }
  }
}

void AccumulateRowsInt8(const uint8_t* const* a, float* const* y, int64_t n, const PackedWeights& w, const float* scale,
                        int64_t cout) {
#if defined(__x86_64__)
  if (HasVectorUnits()) {
    VectorRowsInt8(a, y, n, w, scale, cout);
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
