// Whether kernels may take their AVX2/FMA paths: the CPU has both and the environment does not set
// SPARSE_LOWER_PORTABLE_KERNELS=1, which forces the portable loops on any CPU (how the tests reach them on
// a machine with AVX2, and a way to rule the vector paths out when results look wrong). Read once.
#pragma once

namespace sparse_lower {

bool HasVectorUnits();

}  // namespace sparse_lower
