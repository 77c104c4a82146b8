// The aarch64 bodies of the row GEMMs (conv/row_gemm.h, conv/row_gemm_int8.h), which dispatch to them
// from the CPU's units (common/vector_units.h). Defined on aarch64 only. Each gives the bits of the x86
// vector paths: a column's float sum is the same chain of fused multiply-adds in ascending channel order,
// and an int8 sum is exact in int32 whatever the instruction that forms it.
#pragma once

#include <cstdint>

#include "conv/row_gemm_int8.h"

namespace sparse_lower {

// AccumulateRows by FMLA: 6 rows × 16 columns of accumulators, each channel's input broadcast (LD1R).
void NeonRows(const float* const* a, float* const* y, int64_t n, int64_t cin, const float* w, int64_t cout);

// AccumulateRowsInt8 by SDOT (FEAT_DotProd) on weights packed in quads (PackedWeights::Layout::kQuads).
// SDOT multiplies signed bytes only, so each u8 code a is taken as a − 128 and the column's
// 128 · Σ_c w[c][o] (PackedWeights::Offsets) added back: the same int32 sum.
void DotRowsInt8(const uint8_t* const* a, float* const* y, int64_t n, const PackedWeights& w, const float* scale,
                 int64_t cout);

// AccumulateRowsInt8 by USMMLA (FEAT_I8MM: u8 × s8, 2 rows × 2 columns × 8 channels an instruction) on
// weights packed in octets (PackedWeights::Layout::kOctets).
void MmlaRowsInt8(const uint8_t* const* a, float* const* y, int64_t n, const PackedWeights& w, const float* scale,
                  int64_t cout);

}  // namespace sparse_lower
