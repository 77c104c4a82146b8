// The C ABI of cuda/abi.h over the CUDA backend, in libsparse_lower_cuda.so (tools/gpu_check.py).
#include "cuda/device/cuda_backend.h"

namespace sparse_lower {
using Backend = CudaBackend;
}  // namespace sparse_lower

#include "cuda/abi.inl"
