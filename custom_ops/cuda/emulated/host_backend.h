// The host backend: the launches of the CUDA library's algorithms (cuda/algorithms.h) as loops on the
// host, one thread after another, over host memory. The emulated library built from it runs the same
// bodies as the GPU (cuda/bodies/), so CI tests their index arithmetic on machines without a GPU.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/bodies/conv.h"
#include "cuda/bodies/conv_int8.h"

namespace sparse_lower {

struct HostBackend {
  using Stream = void*;  // unused: everything runs at once

  static constexpr const char* kName = "emulated";

  static Stream NewStream(int32_t) { return nullptr; }

  // The multiprocessors the launches fill: an H100's or H200's 132, so that the emulated conv splits its
  // taps as it does on those GPUs.
  static constexpr int kEmulatedMultiprocessors = 132;
  static int Multiprocessors(Stream);

  template <typename T>
  class Buffer {
   public:
    Buffer(Stream, int64_t count) : data_(static_cast<size_t>(count > 0 ? count : 0)) {}
    T* data() { return data_.data(); }
    const T* data() const { return data_.data(); }

   private:
    std::vector<T> data_;
  };

  template <typename F>
  static void ForEach(Stream, int64_t count, F f) {
    for (int64_t i = 0; i < count; ++i) f(i);
  }

  static void ToHost(Stream, void* host, const void* from, size_t bytes) {
    if (bytes) std::memcpy(host, from, bytes);
  }
  static void FromHost(Stream, void* to, const void* host, size_t bytes) {
    if (bytes) std::memcpy(to, host, bytes);
  }

  // Sorts data[0, count) ascending and moves its distinct values first; returns how many there are.
  static int64_t SortUnique(Stream, int64_t* data, int64_t count);
  // Sorts (keys, values) by key, equal keys keeping their order.
  static void StableSortByKey(Stream, int64_t* keys, int64_t* values, int64_t count);
  // The positions i < count with flags[i] ≠ 0, ascending, into out; returns how many.
  static int64_t Select(Stream, const uint8_t* flags, int64_t count, int64_t* out);

  static void ConvFloat(Stream, const bodies::ConvArgs& args);
  // Products in float16 or bfloat16 (`products`), as the tensor cores compute them.
  static void ConvHalf(Stream, const bodies::ConvArgs& args, bodies::Products products);
  static void ConvInt8(Stream, const bodies::Int8ConvArgs& args);
};

}  // namespace sparse_lower
