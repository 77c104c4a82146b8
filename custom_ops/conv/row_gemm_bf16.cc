#include "conv/row_gemm_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/vector_units.h"

namespace sparse_lower {
namespace {

#if defined(__x86_64__)
// The upper halves of ToBf16 for 16 values at once: the same integer rounding, NaNs quieted the same way.
__attribute__((target("avx512f"))) inline __m512i Bf16Halves(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF));  // to nearest, ties to even
  const __m512i nearest = _mm512_srli_epi32(_mm512_add_epi32(bits, up), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), nearest, quiet);
}

__attribute__((target("avx512f"))) int64_t ToBf16Wide(const float* values, int64_t count, uint16_t* bits) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256i halves = _mm512_cvtepi32_epi16(Bf16Halves(_mm512_loadu_ps(values + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + i), halves);
  }
  return i;
}

__attribute__((target("avx512f"))) int64_t RoundToBf16Wide(const float* values, int64_t count, float* rounded) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    _mm512_storeu_ps(rounded + i, _mm512_castsi512_ps(_mm512_slli_epi32(Bf16Halves(_mm512_loadu_ps(values + i)), 16)));
  }
  return i;
}
#endif

}  // namespace

uint16_t ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet, whatever its payload
  bits += 0x7FFF + ((bits >> 16) & 1);  // to nearest, ties to even (an overflow rounds to infinity)
  return static_cast<uint16_t>(bits >> 16);
}

float FromBf16(uint16_t bits) {
  const uint32_t wide = uint32_t{bits} << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

void ToBf16(const float* values, int64_t count, uint16_t* bits) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (HasAvx512()) i = ToBf16Wide(values, count, bits);
#endif
  for (; i < count; ++i) bits[i] = ToBf16(values[i]);
}

void RoundToBf16(const float* values, int64_t count, float* rounded) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (HasAvx512()) i = RoundToBf16Wide(values, count, rounded);
#endif
  for (; i < count; ++i) rounded[i] = FromBf16(ToBf16(values[i]));
}

Bf16Weights::Bf16Weights(const float* w, int64_t cin, int64_t cout)
    : depth_(std::min<int64_t>(16, std::max<int64_t>(1, (cin + 1) / 2))),
      chunks_(((cin + 1) / 2 + depth_ - 1) / depth_),
      values_(static_cast<size_t>((cout + 15) / 16 * chunks_ * depth_ * 32), 0) {
  for (int64_t c = 0; c < cin; ++c) {
    for (int64_t o = 0; o < cout; ++o) {
      const int64_t at = ((o / 16 * chunks_ + c / 2 / depth_) * depth_ + c / 2 % depth_) * 32 + (o % 16) * 2 + c % 2;
      values_[static_cast<size_t>(at)] = ToBf16(w[c * cout + o]);
    }
  }
}

}  // namespace sparse_lower
