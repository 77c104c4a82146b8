// Reading inputs and allocating outputs through the kernel context.
#pragma once

#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

// An input tensor: its data and shape.
template <typename T>
struct Input {
  const T* data = nullptr;
  std::vector<int64_t> shape;

  int64_t Rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t Size() const { return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>()); }
};

// Whether optional input `index` is present.
inline bool HasInput(const Ort::KernelContext& ctx, size_t index) {
  return index < ctx.GetInputCount() && ctx.GetInput(index) != nullptr;
}

// The shape of input `index`, whatever its element type.
inline std::vector<int64_t> InputShape(const Ort::KernelContext& ctx, size_t index) {
  return ctx.GetInput(index).GetTensorTypeAndShapeInfo().GetShape();
}

template <typename T>
Input<T> ReadInput(const Ort::KernelContext& ctx, size_t index) {
  const Ort::ConstValue value = ctx.GetInput(index);
  return Input<T>{value.GetTensorData<T>(), value.GetTensorTypeAndShapeInfo().GetShape()};
}

template <typename T>
T* AllocateOutput(const Ort::KernelContext& ctx, size_t index, const std::vector<int64_t>& shape) {
  return ctx.GetOutput(index, shape).GetTensorMutableData<T>();
}

}  // namespace sparse_lower
