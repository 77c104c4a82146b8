// ActiveSites (docs/custom_ops.md, "Index builders"): the sparse coordinates of a dense tensor.
#pragma once

#include "common/coords.h"
#include "common/op.h"
#include "common/tensor.h"

namespace sparse_lower {

// coords [N, 1+D], sites [N, 1]: the active sites of a dense [B, C, *S] tensor, sorted.
struct ActiveSites {
  static constexpr const char* kName = "ActiveSites";
  static constexpr InputSpec kInputs[] = {{kFloat, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64, kInt64};

  explicit ActiveSites(const Ort::ConstKernelInfo&) {}
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext&) {}  // N is data-dependent

  // X, checked, with its grid, batch, channels and B·V sites (0 when C = 0): what the CPU and CUDA
  // kernels (cuda/device/ops.cu) share.
  struct DenseInput {
    Input<float> x;
    Grid grid;
    int64_t batch, channels, total;
  };
  static DenseInput Read(const Ort::KernelContext& ctx);
};

}  // namespace sparse_lower
