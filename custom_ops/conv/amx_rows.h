// The AMX body of the int8 row GEMM (conv/row_gemm_int8.h), which dispatches to it where the weights were
// packed in tiles (PackedWeights::Layout::kTiles: the CPU has AMX, common/vector_units.h). Defined on
// x86-64 only. Its int32 sums are the VNNI path's (each exact), scaled and added by the same FMA, so it
// gives the same bits.
#pragma once

#include <cstdint>

#include "conv/row_gemm_int8.h"

namespace sparse_lower {

// AccumulateRowsInt8 by tdpbusd (u8 rows × s8 weights, int32 sums): 16 rows at a time are copied into
// one contiguous block (the rows are gathered by address, and a tile loads rows at a fixed stride), each
// padded with zeros to whole chunks of 64 channels, then multiplied with up to 4 tiles of 16 columns.
void AmxRowsInt8(const uint8_t* const* a, float* const* y, int64_t n, const PackedWeights& w, const float* scale,
                 int64_t cout);

}  // namespace sparse_lower
