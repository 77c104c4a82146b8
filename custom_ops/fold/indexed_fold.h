// IndexedFold: Y starts at zero (or at input init) and receives rows[p] at idx[p] in ascending p (-1 skipped).
#pragma once

#include <optional>

#include "common/coords.h"
#include "common/op.h"
#include "common/tensor.h"

namespace sparse_lower {

// mode "rows": Y [M, C] with M = like.shape[0], idx holding rows of Y and optional init [M, C] or [C].
// mode "dense": Y [batch_size, C, *spatial_shape] with idx holding linear sites.
class IndexedFold {
 public:
  static constexpr const char* kName = "IndexedFold";
  static constexpr InputSpec kInputs[] = {{kFloat, false}, {kInt64, false}, {kAnyType, true}, {kFloat, true}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kFloat};

  explicit IndexedFold(const Ort::ConstKernelInfo& info);
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 protected:  // the CUDA kernels (cuda/device/ops.cu) derive from these, sharing their checks
  // The inputs, checked, and what they imply.
  struct Inputs {
    Input<float> rows;
    Input<int64_t> idx;
    int64_t channels = 0;
    int64_t targets = 0;             // the rows of Y, or for mode "dense" its sites
    std::vector<int64_t> y_shape;
    const float* init = nullptr;     // mode "rows": what Y starts from
    bool init_rows = false;          // init holds every row of Y, not one [C] for all
  };
  Inputs Read(const Ort::KernelContext& ctx) const;

  std::optional<Grid> grid_;  // mode "dense" only
  int64_t batch_size_ = 0;
};

}  // namespace sparse_lower
