// The AMX bodies of the row GEMMs (conv/row_gemm_int8.h, conv/row_gemm_bf16.h), which run where the CPU
// has the tiles (common/vector_units.h: HasAmx, HasAmxBf16). Defined on x86-64 only. Each takes 16 rows at
// a time, copies them into one contiguous block (the rows are gathered by address, and a tile loads rows
// at a fixed stride), each padded with zeros to whole 64-byte tile rows, and multiplies the block with up
// to 4 tiles of 16 columns at once.
#pragma once

#include <cstdint>

#include "conv/row_gemm_bf16.h"
#include "conv/row_gemm_int8.h"

namespace sparse_lower {

// AccumulateRowsInt8 by tdpbusd (u8 rows × s8 weights, int32 sums) on weights packed in tiles
// (PackedWeights::Layout::kTiles). Its int32 sums are the VNNI path's (each exact), scaled and added by the
// same FMA, so it gives the same bits.
void AmxRowsInt8(const uint8_t* const* a, float* const* y, int64_t n, const PackedWeights& w, const float* scale,
                 int64_t cout);

// y[i][o] += Σ_c a[i][c] · w[c][o] for i in [0, n), o in [0, cout) by tdpbf16ps: a[i] are rows of Cin
// bfloat16 values, their products summed in float32 over each chunk of 32 channels, the chunks in order.
void AmxRowsBf16(const uint16_t* const* a, float* const* y, int64_t n, int64_t cin, const Bf16Weights& w,
                 int64_t cout);

}  // namespace sparse_lower
