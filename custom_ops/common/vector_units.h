// The vector units the kernels may use, read once from the CPU and the environment. Each kernel with a
// vector path dispatches on these at run time, so one library serves every x86-64 CPU:
//   * AVX2 + FMA: every kernel's vector path;
//   * AVX-512 F: IndexedConv's float products, 16 columns a register;
//   * AVX-512 with VNNI (vpdpbusd): IndexedConvInt8's products, 16 columns and 4 channels an instruction.
// SPARSE_LOWER_PORTABLE_KERNELS=1 forces the portable loops on any CPU, SPARSE_LOWER_NO_AVX512=1 the AVX2
// paths on a CPU with AVX-512: how the tests reach the narrower paths on a wider CPU, and a way to rule
// the vector paths out when results look wrong. Every path gives the same bits.
#pragma once

namespace sparse_lower {

bool HasVectorUnits();  // AVX2 + FMA
bool HasAvx512();       // AVX-512 F (implies HasVectorUnits)
bool HasVnni();         // AVX-512 F, BW and VNNI (implies HasAvx512)

}  // namespace sparse_lower

// "avx512-vnni", "avx512", "avx2" or "portable": the widest units the kernels use here (what benchmarks
// report).
extern "C" const char* SparseLowerVectorUnits();
