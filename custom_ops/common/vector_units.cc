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

}  // namespace sparse_lower
