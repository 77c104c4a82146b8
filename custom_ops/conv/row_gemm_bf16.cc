#include "conv/row_gemm_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace sparse_lower {

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
