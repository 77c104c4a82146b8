// The CUDA backend: the launches of the library's algorithms (cuda/algorithms.h) as kernels on a
// stream, over device memory. Compiled by nvcc only; cuda/emulated/host_backend.h is its twin on the host.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "cuda/bodies/conv.h"
#include "cuda/bodies/conv_int8.h"

namespace sparse_lower {

// Throws the error of a CUDA call, naming it.
void CheckCuda(cudaError_t status, const char* what);

template <typename F>
__global__ void ForEachKernel(int64_t count, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += step) f(i);
}

struct CudaBackend {
  using Stream = cudaStream_t;

  static constexpr const char* kName = "cuda";

  // A non-blocking stream on GPU `device` (its primary context, which onnxruntime's CUDA provider shares).
  static Stream NewStream(int32_t device);
  // The multiprocessors of the current GPU.
  static int Multiprocessors(Stream stream);

  // Device memory, allocated and freed in stream order (cudaMallocAsync): a kernel's scratch costs no
  // synchronisation.
  template <typename T>
  class Buffer {
   public:
    Buffer(Stream stream, int64_t count) : stream_(stream) {
      if (count > 0) CheckCuda(cudaMallocAsync(reinterpret_cast<void**>(&data_), sizeof(T) * count, stream), "cudaMallocAsync");
    }
    ~Buffer() {
      if (data_) cudaFreeAsync(data_, stream_);
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    T* data() { return data_; }
    const T* data() const { return data_; }

   private:
    Stream stream_;
    T* data_ = nullptr;
  };

  template <typename F>
  static void ForEach(Stream stream, int64_t count, F f) {
    if (count <= 0) return;
    constexpr int kThreads = 256;
    const int64_t blocks = (count + kThreads - 1) / kThreads;
    ForEachKernel<<<static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32), kThreads, 0, stream>>>(count, f);
    CheckCuda(cudaGetLastError(), "a kernel launch");
  }

  // Device to host, waiting for the stream.
  static void ToHost(Stream stream, void* host, const void* from, size_t bytes);
  // Host to device, in stream order (the host memory must stay until the stream gets there).
  static void FromHost(Stream stream, void* to, const void* host, size_t bytes);

  static int64_t SortUnique(Stream stream, int64_t* data, int64_t count);
  static void StableSortByKey(Stream stream, int64_t* keys, int64_t* values, int64_t count);
  static int64_t Select(Stream stream, const uint8_t* flags, int64_t count, int64_t* out);

  static void ConvFloat(Stream stream, const bodies::ConvArgs& args);
  // Products in float16 or bfloat16 (`products`) on tensor cores, summed in float32.
  static void ConvHalf(Stream stream, const bodies::ConvArgs& args, bodies::Products products);
  static void ConvInt8(Stream stream, const bodies::Int8ConvArgs& args);
};

}  // namespace sparse_lower
