// The vector units the kernels may use, read once from the CPU and the environment. Each kernel with a
// vector path dispatches on these at run time, so one library serves every CPU of its architecture.
// x86-64:
//   * AVX2 + FMA: every kernel's vector path;
//   * AVX-512 F: IndexedConv's float products, 16 columns a register;
//   * AVX-512 with VNNI (vpdpbusd): IndexedConvInt8's products, 16 columns and 4 channels an instruction;
//   * AMX (AMX-TILE and AMX-INT8: tdpbusd, 16 rows × 16 columns × 64 channels an instruction, Xeon Sapphire
//     Rapids and later): IndexedConvInt8's products, where the kernel also grants the process the tile
//     state (arch_prctl ARCH_REQ_XCOMP_PERM); with AMX-BF16 (tdpbf16ps, 32 channels an instruction)
//     IndexedConv's products at precision "bfloat16".
//   * POPCNT: the bit counts of the index builders' site bits (index/site_bits.h).
// aarch64 (NEON is part of every aarch64 CPU; the others are read from the kernel's HWCAP bits):
//   * NEON: IndexedConv's float products by FMLA, 4 columns a register;
//   * the dot-product instructions (FEAT_DotProd: SDOT): IndexedConvInt8's products, 4 columns and 4
//     channels an instruction (Cortex-A76/A78, Neoverse N1: RK3588, Jetson Orin);
//   * the int8 matrix multiply (FEAT_I8MM: USMMLA): 2 rows × 2 columns × 8 channels an instruction
//     (Cortex-A710 and later, Neoverse N2/V1).
// SPARSE_LOWER_PORTABLE_KERNELS=1 forces the portable loops on any CPU; SPARSE_LOWER_NO_AVX512=1 the AVX2
// paths on a CPU with AVX-512, SPARSE_LOWER_NO_AMX=1 the VNNI path on a CPU with AMX,
// SPARSE_LOWER_NO_I8MM=1 the SDOT path on a CPU with I8MM: how the tests
// reach the narrower paths on a wider CPU, and a way to rule the vector paths out when results look
// wrong. Every path gives the same bits, except the portable float loop on x86 (no FMA there).
#pragma once

namespace sparse_lower {

bool HasVectorUnits();  // x86-64: AVX2 + FMA
bool HasAvx512();       // x86-64: AVX-512 F (implies HasVectorUnits)
bool HasVnni();         // x86-64: AVX-512 F, BW and VNNI (implies HasAvx512)
bool HasAmx();          // x86-64: AMX-TILE and AMX-INT8, the tile state granted (implies HasVnni)
bool HasAmxBf16();      // x86-64: AMX-TILE and AMX-BF16, the tile state granted (implies HasVnni)
bool HasPopcnt();       // x86-64: POPCNT (not in the x86-64 baseline: see common/bit_count.h)
bool HasNeon();         // aarch64: NEON, unless the portable loops are forced
bool HasDotProd();      // aarch64: SDOT/UDOT (implies HasNeon)
bool HasI8mm();         // aarch64: USMMLA and the other I8MM instructions (implies HasDotProd)

}  // namespace sparse_lower

// The widest units the kernels use here (what benchmarks report): on x86-64 "avx512-amx", "avx512-vnni",
// "avx512" or
// "avx2", on aarch64 "neon-i8mm", "neon-dotprod" or "neon"; "portable" anywhere.
extern "C" const char* SparseLowerVectorUnits();
