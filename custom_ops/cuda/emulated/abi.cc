// The C ABI of cuda/abi.h over the host backend: libsparse_lower_emulated.so, the GPU's bodies run on
// the host (tests/test_cuda_bodies.py).
#include "cuda/emulated/host_backend.h"

namespace sparse_lower {
using Backend = HostBackend;
}  // namespace sparse_lower

#include "cuda/abi.inl"
