#include "common/vector_units.h"

#include <cstdlib>

#if defined(__aarch64__)
#include <sys/auxv.h>
#endif
#if defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace sparse_lower {
namespace {

bool Forced(const char* variable) { return std::getenv(variable) != nullptr; }

}  // namespace

bool HasVectorUnits() {
#if defined(__x86_64__)
  static const bool has = !Forced("SPARSE_LOWER_PORTABLE_KERNELS") && __builtin_cpu_supports("avx2") &&
                          __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

bool HasAvx512() {
#if defined(__x86_64__)
  static const bool has = HasVectorUnits() && !Forced("SPARSE_LOWER_NO_AVX512") && __builtin_cpu_supports("avx512f");
  return has;
#else
  return false;
#endif
}

bool HasVnni() {
#if defined(__x86_64__)
  static const bool has = HasAvx512() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
}

#if defined(__x86_64__)
namespace {

// AMX's tiles where the CPU has them, SPARSE_LOWER_NO_AMX does not rule them out, and Linux grants the
// process their state: it keeps the tiles' 8 KiB off until a process asks (ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA), and a tile instruction before that is a fault. The grant holds for every thread.
bool HasTiles() {
  constexpr long kRequestPermission = 0x1023;
  constexpr long kTileData = 18;
  static const bool has = HasVnni() && !Forced("SPARSE_LOWER_NO_AMX") && __builtin_cpu_supports("amx-tile") &&
                          syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  return has;
}

}  // namespace
#endif

bool HasAmx() {
#if defined(__x86_64__)
  static const bool has = HasTiles() && __builtin_cpu_supports("amx-int8");
  return has;
#else
  return false;
#endif
}

bool HasAmxBf16() {
#if defined(__x86_64__)
  static const bool has = HasTiles() && __builtin_cpu_supports("amx-bf16");
  return has;
#else
  return false;
#endif
}

bool HasPopcnt() {
#if defined(__x86_64__)
  static const bool has = !Forced("SPARSE_LOWER_PORTABLE_KERNELS") && __builtin_cpu_supports("popcnt");
  return has;
#else
  return false;
#endif
}

bool HasNeon() {
#if defined(__aarch64__)
  static const bool has = !Forced("SPARSE_LOWER_PORTABLE_KERNELS");
  return has;
#else
  return false;
#endif
}

bool HasDotProd() {
#if defined(__aarch64__)
  static const bool has = HasNeon() && (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
  return has;
#else
  return false;
#endif
}

bool HasI8mm() {
#if defined(__aarch64__)
  static const bool has = HasDotProd() && !Forced("SPARSE_LOWER_NO_I8MM") && (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
  return has;
#else
  return false;
#endif
}

}  // namespace sparse_lower

extern "C" __attribute__((visibility("default"))) const char* SparseLowerVectorUnits() {
  using namespace sparse_lower;
  if (HasI8mm()) return "neon-i8mm";
  if (HasDotProd()) return "neon-dotprod";
  if (HasNeon()) return "neon";
  if (HasAmx()) return "avx512-amx";
  return HasVnni() ? "avx512-vnni" : HasAvx512() ? "avx512" : HasVectorUnits() ? "avx2" : "portable";
}
