#include "common/vector_units.h"

#include <cstdlib>

namespace sparse_lower {

bool HasVectorUnits() {
#if defined(__x86_64__)
  static const bool has = std::getenv("SPARSE_LOWER_PORTABLE_KERNELS") == nullptr &&
                          __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

bool HasAvx512() {
#if defined(__x86_64__)
  static const bool has = HasVectorUnits() && std::getenv("SPARSE_LOWER_NO_AVX512") == nullptr &&
                          __builtin_cpu_supports("avx512f");
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

}  // namespace sparse_lower

extern "C" __attribute__((visibility("default"))) const char* SparseLowerVectorUnits() {
  using namespace sparse_lower;
  return HasVnni() ? "avx512-vnni" : HasAvx512() ? "avx512" : HasVectorUnits() ? "avx2" : "portable";
}
