// What lets one body of code run on a CUDA device and on the host: the bodies of the CUDA kernels
// (custom_ops/cuda/bodies/) are written once with these and compiled twice, by nvcc into the CUDA
// library and by the C++ compiler into the emulated one, whose tests run in CI on machines without a GPU.
//
// SL_HD marks a function callable from both sides; SL_LAMBDA opens a lambda that a launch runs on
// either. The atomics are the device's own under nvcc and plain reads and writes on the host, where the
// emulated launches run one thread at a time.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SL_HD __host__ __device__
#define SL_LAMBDA [=] __host__ __device__
#else
#define SL_HD
#define SL_LAMBDA [=]
#endif

namespace sparse_lower {
namespace bodies {

// *address = desired where it held `expected`; returns what it held.
SL_HD inline int64_t AtomicCas(int64_t* address, int64_t expected, int64_t desired) {
#if defined(__CUDA_ARCH__)
  return static_cast<int64_t>(atomicCAS(reinterpret_cast<unsigned long long*>(address),
                                        static_cast<unsigned long long>(expected),
                                        static_cast<unsigned long long>(desired)));
#else
  const int64_t held = *address;
  if (held == expected) *address = desired;
  return held;
#endif
}

// *address = min(*address, value).
SL_HD inline void AtomicMin(int64_t* address, int64_t value) {
#if defined(__CUDA_ARCH__)
  atomicMin(reinterpret_cast<long long*>(address), static_cast<long long>(value));
#else
  if (value < *address) *address = value;
#endif
}

// *address = max(*address, value).
SL_HD inline void AtomicMax(int64_t* address, int64_t value) {
#if defined(__CUDA_ARCH__)
  atomicMax(reinterpret_cast<long long*>(address), static_cast<long long>(value));
#else
  if (value > *address) *address = value;
#endif
}

}  // namespace bodies
}  // namespace sparse_lower
