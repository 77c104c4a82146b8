// SiteOrder (docs/custom_ops.md, "Index builders"): a coordinate table's rows in the order of their sites.
#pragma once

#include "common/coords.h"
#include "common/op.h"

namespace sparse_lower {

// out_coords [N, 1+D]: the rows of coords [N, 1+D] by ascending linear site (batch first, then the spatial
// axes in order); order [N, 1]: the row of coords each of them is (out_coords[i] = coords[order[i, 0]]);
// rank [N, 1]: the position of each row of coords in that order (rank[order[i, 0], 0] = i). Every
// coordinate is checked as the map builders check theirs (inside spatial_shape, batch ≥ 0, no two rows
// equal). order and rank are one-tap tables, so that IndexedUnfold moves rows into the order and back.
//
// Why: a frame's rows come in its sensor's scan order, and the first level's tables and convs keep it,
// so the neighbours of consecutive rows lie anywhere in the features. The gpu target takes that level's
// rows into site order once (passes/site_order.py), and `rank` puts the rows a graph returns back into
// the frame's order.
class SiteOrder {
 public:
  static constexpr const char* kName = "SiteOrder";
  static constexpr InputSpec kInputs[] = {{kInt64, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64, kInt64, kInt64};

  explicit SiteOrder(const Ort::ConstKernelInfo& info);
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 protected:  // the CUDA kernel (cuda/device/ops.cu) derives from it, sharing its checks
  Grid grid_;
};

}  // namespace sparse_lower
