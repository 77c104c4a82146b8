// IndexedFold: Y starts at zero (or at input init) and receives rows[p] at idx[p] in ascending p (-1 skipped).
#pragma once

#include <optional>

#include "common/coords.h"
#include "common/op.h"

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

 private:
  std::optional<Grid> grid_;  // mode "dense" only
  int64_t batch_size_ = 0;
};

}  // namespace sparse_lower
