// Loops that count bits (__builtin_popcountll), run with the CPU's one-instruction count where it has
// one. The x86-64 baseline the library is built for has no POPCNT, so there the builtin is a call to a
// library routine, once per word and once per lookup of SiteBits: with POPCNT the CenterPoint backbone's
// four StridedMaps on the real frame (2 threads) take 8.1 ms instead of 9.7. aarch64's baseline counts
// in NEON, inline, and needs none of this.
#pragma once

#include "common/vector_units.h"

namespace sparse_lower {

#if defined(__x86_64__)
// f(), with everything it calls inlined and compiled for POPCNT.
template <typename F>
__attribute__((target("popcnt"), flatten)) void WithPopcnt(F& f) {
  f();
}
#endif

// Runs f() (a loop whose bit counts weigh), counting with POPCNT where the CPU has it (HasPopcnt); the
// counts are the same either way.
template <typename F>
void CountingBits(F&& f) {
#if defined(__x86_64__)
  if (HasPopcnt()) {
    WithPopcnt(f);
    return;
  }
#endif
  f();
}

}  // namespace sparse_lower
