#include "cuda/device/cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <thrust/copy.h>
#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/sort.h>
#include <thrust/unique.h>

namespace sparse_lower {
namespace {

using namespace bodies;

// thrust's algorithms on `stream`, without synchronising after each.
auto On(cudaStream_t stream) { return thrust::cuda::par_nosync.on(stream); }

// The phases of cuda/bodies/conv.h with a barrier between them; the first two list the tap's inputs.
// Returns whether some row of the tile has an input through tap k (the same answer in every thread).
__device__ bool ListTap(const ConvArgs& a, int64_t first_row, int64_t k, TileSources& sources) {
  if (threadIdx.x == 0) ClearSources(sources);
  __syncthreads();
  ListSource(a, first_row, k, threadIdx.x, sources);
  __syncthreads();
  return sources.any != 0;
}

template <typename T>
__global__ void __launch_bounds__(T::kFloatThreads) ConvFloatKernel(ConvArgs a) {
  __shared__ TileSources sources;
  __shared__ FloatSlice<T> slice;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kTileRows;
  const int64_t first_col = static_cast<int64_t>(blockIdx.y) * T::kCols;
  const int t = threadIdx.x, z = blockIdx.z;
  FloatAccumulators acc;
  StartFloat<T>(a, first_col, t, acc);
  for (int64_t k = TapsBegin(a, z); k < TapsEnd(a, z); ++k) {
    if (!ListTap(a, first_row, k, sources)) continue;
    for (int64_t c0 = 0; c0 < a.cin; c0 += kTileDepth) {
      LoadFloatSlice(a, sources, k, c0, first_col, t, slice);
      __syncthreads();
      MultiplyFloatSlice(slice, t, acc);
      __syncthreads();
    }
  }
  StoreFloat<T>(a, z, first_row, first_col, t, acc);
}

// X and W rounded to H (__half or __nv_bfloat16), to nearest, ties to even.
template <typename H>
struct Rounded {
  __device__ H operator()(float v) const;
};
template <>
__device__ __half Rounded<__half>::operator()(float v) const { return __float2half_rn(v); }
template <>
__device__ __nv_bfloat16 Rounded<__nv_bfloat16>::operator()(float v) const { return __float2bfloat16_rn(v); }

template <typename T, typename H>
__global__ void __launch_bounds__(T::kHalfThreads) ConvHalfKernel(ConvArgs a) {
  using namespace nvcuda;
  constexpr int kFragments = T::kWarpCols / 16;  // a warp's 2 × 1 or 2 × 2 fragments of 16 × 16
  __shared__ TileSources sources;
  __shared__ __align__(32) H x[kTileRows * kHalfSliceLead];
  __shared__ __align__(32) H w[kTileDepth * T::kWeightLead];
  __shared__ __align__(32) float tile[kTileRows * T::kLead];
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kTileRows;
  const int64_t first_col = static_cast<int64_t>(blockIdx.y) * T::kCols;
  const int t = threadIdx.x, warp = t / 32, z = blockIdx.z;
  const int r0 = WarpRow<T>(warp), n0 = WarpCol<T>(warp);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][kFragments];
  for (auto& row : acc) {
    for (auto& fragment : row) wmma::fill_fragment(fragment, 0.0f);
  }
  for (int64_t k = TapsBegin(a, z); k < TapsEnd(a, z); ++k) {
    if (!ListTap(a, first_row, k, sources)) continue;
    for (int64_t c0 = 0; c0 < a.cin; c0 += kTileDepth) {
      LoadHalfSlice<T>(a, sources, k, c0, first_col, t, x, w, Rounded<H>());
      __syncthreads();
      for (int i = 0; i < 2; ++i) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, H, wmma::row_major> xa;
        wmma::load_matrix_sync(xa, x + (r0 + 16 * i) * kHalfSliceLead, kHalfSliceLead);
        for (int j = 0; j < kFragments; ++j) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, H, wmma::row_major> wb;
          wmma::load_matrix_sync(wb, w + n0 + 16 * j, T::kWeightLead);
          wmma::mma_sync(acc[i][j], xa, wb, acc[i][j]);
        }
      }
      __syncthreads();
    }
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < kFragments; ++j) {
      wmma::store_matrix_sync(tile + (r0 + 16 * i) * T::kLead + n0 + 16 * j, acc[i][j], T::kLead, wmma::mem_row_major);
    }
  }
  __syncthreads();
  StoreHalf<T>(a, z, first_row, first_col, t, tile);
}

__global__ void __launch_bounds__(kInt8Threads) ConvInt8Kernel(Int8ConvArgs a) {
  using namespace nvcuda;
  __shared__ TileSources sources;
  __shared__ __align__(32) int8_t x[kTileRows * kTileDepth];
  __shared__ __align__(32) int8_t w[kTileCols * kTileDepth];
  __shared__ __align__(32) int32_t sums[kTileRows * kTileLead];
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kTileRows;
  const int64_t first_col = static_cast<int64_t>(blockIdx.y) * kTileCols;
  const int t = threadIdx.x, warp = t / 32;
  const int r0 = (warp / (kTileCols / kWarpTile)) * kWarpTile, n0 = (warp % (kTileCols / kWarpTile)) * kWarpTile;
  Int8Accumulators acc;
  StartInt8(a, first_col, t, acc);
  for (int64_t k = 0; k < a.conv.taps; ++k) {
    if (!ListTap(a.conv, first_row, k, sources)) continue;
    wmma::fragment<wmma::accumulator, 16, 16, 16, int> tap[2][2];
    for (auto& row : tap) {
      for (auto& fragment : row) wmma::fill_fragment(fragment, 0);
    }
    for (int64_t c0 = 0; c0 < a.conv.cin; c0 += kTileDepth) {
      LoadInt8Slice(a, sources, k, c0, first_col, t, x, w);
      __syncthreads();
      for (int i = 0; i < 2; ++i) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, signed char, wmma::row_major> xa;
        wmma::load_matrix_sync(xa, reinterpret_cast<const signed char*>(x) + (r0 + 16 * i) * kTileDepth, kTileDepth);
        for (int j = 0; j < 2; ++j) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, signed char, wmma::col_major> wb;
          wmma::load_matrix_sync(wb, reinterpret_cast<const signed char*>(w) + (n0 + 16 * j) * kTileDepth, kTileDepth);
          wmma::mma_sync(tap[i][j], xa, wb, tap[i][j]);
        }
      }
      __syncthreads();
    }
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        wmma::store_matrix_sync(sums + (r0 + 16 * i) * kTileLead + n0 + 16 * j, tap[i][j], kTileLead,
                                wmma::mem_row_major);
      }
    }
    __syncthreads();
    AddInt8Tap(a, sources, k, first_col, t, sums, acc);
    __syncthreads();  // the next tap lists its sources and stores its sums over these
  }
  StoreInt8(a, first_row, first_col, t, acc);
}

// The blocks of a launch: row tiles × column tiles of `cols` × the split of the taps.
dim3 TileGrid(const ConvArgs& a, int cols = kTileCols) {
  return dim3(static_cast<unsigned>((a.rows + kTileRows - 1) / kTileRows),
              static_cast<unsigned>((a.cout + cols - 1) / cols), static_cast<unsigned>(a.splits));
}

}  // namespace

void CheckCuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) Fail("CUDA error in ", what, ": ", cudaGetErrorString(status));
}

cudaStream_t CudaBackend::NewStream(int32_t device) {
  CheckCuda(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return stream;
}

int CudaBackend::Multiprocessors(Stream) {
  int device = 0, count = 0;
  CheckCuda(cudaGetDevice(&device), "cudaGetDevice");
  CheckCuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return count;
}

void CudaBackend::ToHost(Stream stream, void* host, const void* from, size_t bytes) {
  if (bytes) CheckCuda(cudaMemcpyAsync(host, from, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  CheckCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

void CudaBackend::FromHost(Stream stream, void* to, const void* host, size_t bytes) {
  if (bytes) CheckCuda(cudaMemcpyAsync(to, host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
}

int64_t CudaBackend::SortUnique(Stream stream, int64_t* data, int64_t count) {
  if (count <= 0) return 0;
  thrust::sort(On(stream), data, data + count);
  return thrust::unique(On(stream), data, data + count) - data;
}

void CudaBackend::StableSortByKey(Stream stream, int64_t* keys, int64_t* values, int64_t count) {
  if (count > 0) thrust::stable_sort_by_key(On(stream), keys, keys + count, values);
}

int64_t CudaBackend::Select(Stream stream, const uint8_t* flags, int64_t count, int64_t* out) {
  if (count <= 0) return 0;
  const thrust::counting_iterator<int64_t> first(0);
  return thrust::copy_if(On(stream), first, first + count, flags, out, [] __device__(uint8_t flag) { return flag != 0; }) -
         out;
}

void CudaBackend::ConvFloat(Stream stream, const ConvArgs& args) {
  if (args.rows == 0 || args.cout == 0) return;
  WithTile(args.cout, [&](auto tile) {
    using T = decltype(tile);
    ConvFloatKernel<T><<<TileGrid(args, T::kCols), T::kFloatThreads, 0, stream>>>(args);
  });
  CheckCuda(cudaGetLastError(), "the IndexedConv kernel (float32)");
}

void CudaBackend::ConvHalf(Stream stream, const ConvArgs& args, Products products) {
  if (args.rows == 0 || args.cout == 0) return;
  WithTile(args.cout, [&](auto tile) {
    using T = decltype(tile);
    if (products == Products::kBfloat16) {
      ConvHalfKernel<T, __nv_bfloat16><<<TileGrid(args, T::kCols), T::kHalfThreads, 0, stream>>>(args);
    } else {
      ConvHalfKernel<T, __half><<<TileGrid(args, T::kCols), T::kHalfThreads, 0, stream>>>(args);
    }
  });
  CheckCuda(cudaGetLastError(), products == Products::kBfloat16 ? "the IndexedConv kernel (bfloat16)"
                                                                 : "the IndexedConv kernel (float16)");
}

void CudaBackend::ConvInt8(Stream stream, const Int8ConvArgs& args) {
  if (args.conv.rows == 0 || args.conv.cout == 0) return;
  ConvInt8Kernel<<<TileGrid(args.conv), kInt8Threads, 0, stream>>>(args);
  CheckCuda(cudaGetLastError(), "the IndexedConvInt8 kernel");
}

}  // namespace sparse_lower
