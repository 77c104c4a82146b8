// IndexedUnfold: Y[..., k·C + c] = channel c of the input that idx[..., k] names (0 where it is -1).
#pragma once

#include <optional>

#include "common/coords.h"
#include "common/op.h"

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

 private:
  std::optional<Grid> grid_;
};

}  // namespace sparse_lower
