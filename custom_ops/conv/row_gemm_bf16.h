// IndexedConv at precision "bfloat16": its rows and weights rounded to bfloat16 (8 bits of mantissa),
// their products summed in float32. With AMX-BF16 the tiles multiply them (conv/amx_rows.h); elsewhere
// the float32 row GEMM (conv/row_gemm.h) multiplies the rounded values, which gives the same products
// (a bfloat16 product is exact in float32) summed in another order.
#pragma once

#include <cstdint>
#include <vector>

namespace sparse_lower {

// `value` rounded to the nearest bfloat16 (ties to even), as its 16 bits; a NaN stays a NaN.
uint16_t ToBf16(float value);
// The float32 whose upper half is `bits`.
float FromBf16(uint16_t bits);
// values [count] as ToBf16 rounds them: to their 16 bits (`bits`), or as float32 (`rounded`:
// FromBf16(ToBf16(v))). Sixteen at a time with AVX-512, where the CPU has it: the rows are rounded at
// every call, and one at a time took a sixth of a 16-channel layer's time.
void ToBf16(const float* values, int64_t count, uint16_t* bits);
void RoundToBf16(const float* values, int64_t count, float* rounded);

// W [Cin, Cout] float in bfloat16, as AMX's tdpbf16ps reads it: Cout in tiles of 16 columns (pairs of
// 8-column blocks, as PackedWeights), Cin in chunks of Depth() pairs of channels (16, or all of a narrower
// row's; zeros past Cin), each chunk of a tile Depth() rows of 64 bytes, a pair of channels' 16 columns
// × 2 to a row, at Tile(pair, chunk).
class Bf16Weights {
 public:
  Bf16Weights(const float* w, int64_t cin, int64_t cout);
  int64_t Depth() const { return depth_; }
  int64_t Chunks() const { return chunks_; }
  const uint16_t* Tile(int64_t pair, int64_t chunk) const {
    return values_.data() + (pair * chunks_ + chunk) * depth_ * 32;
  }

 private:
  int64_t depth_, chunks_;
  std::vector<uint16_t> values_;
};

}  // namespace sparse_lower
