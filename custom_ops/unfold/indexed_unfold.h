// IndexedUnfold: Y[..., k·C + c] = channel c of the input that idx[..., k] names (0 where it is -1).
#pragma once

#include <optional>

#include "common/coords.h"
#include "common/op.h"
#include "common/tensor.h"

namespace sparse_lower {

// X is rows [N, C] (idx holds rows) or dense [B, C, *S] (idx holds linear sites). The optional
// attribute spatial_shape must then equal S: the lowering sets it where the sites come from a conv's
// geometry, so that a dense input of another extent fails instead of being misread. The optional coords [N, 1+D] pairs with row features: X must
// have as many rows.
class IndexedUnfold {
 public:
  static constexpr const char* kName = "IndexedUnfold";
  static constexpr InputSpec kInputs[] = {{kFloat, false}, {kInt64, false}, {kInt64, true}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kFloat};

  explicit IndexedUnfold(const Ort::ConstKernelInfo& info) : grid_(SpatialShape(info)) {}
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 protected:  // the CUDA kernels (cuda/device/ops.cu) derive from these, sharing their checks
  // The inputs, checked, and what they imply.
  struct Inputs {
    Input<float> x;
    Input<int64_t> idx;
    int64_t limit;     // the rows, or for a dense X the sites, that idx may name
    int64_t taps, rows, channels;
    int64_t volume;    // sites per batch of a dense X, else 1
    bool dense;
    std::vector<int64_t> y_shape;
  };
  Inputs Read(const Ort::KernelContext& ctx) const;

  std::optional<Grid> grid_;
};

}  // namespace sparse_lower
