// The multiply-accumulate of IndexedConv: rows addressed through pointers, so that the gathered input
// rows and the scattered output rows are never copied into matrices of their own.
#pragma once

#include <cstdint>

namespace sparse_lower {

// y[i][o] += Σ_c a[i][c] · w[c·cout + o] for i in [0, n), o in [0, cout): a GEMM whose left rows and
// result rows are given by address (an indirect GEMM). No two y[i] may overlap. Each y[i][o] receives
// one sum, taken over c in ascending order, whatever n and i are, so a row's result does not depend on
// which other rows share its call. Uses AVX-512 or AVX2 + FMA where the CPU has them (common/vector_units.h):
// both give the same bits; the portable loop (no FMA) differs in the last bits.
void AccumulateRows(const float* const* a, float* const* y, int64_t n, int64_t cin, const float* w, int64_t cout);

}  // namespace sparse_lower
