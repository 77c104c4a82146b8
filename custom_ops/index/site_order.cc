// SiteOrder: the rows of a coordinate table by ascending site, which row each is, and each row's place.
#include "index/site_order.h"

#include <algorithm>

#include "common/attributes.h"
#include "common/parallel.h"
#include "common/sorted_sites.h"
#include "common/tensor.h"

namespace sparse_lower {

SiteOrder::SiteOrder(const Ort::ConstKernelInfo& info) : grid_(Required(SpatialShape(info), "spatial_shape")) {}

void SiteOrder::Compute(const Ort::KernelContext& ctx) const {
  const Coords coords = ReadCoords(ctx, 0, "coords", grid_.Dims());
  const SortedSites sorted = SortSites(LinearSites(ctx, coords, grid_, "coords", grid_.max_batch), coords, "coords");
  int64_t* out_coords = AllocateOutput<int64_t>(ctx, 0, {coords.rows, coords.width});
  int64_t* order = AllocateOutput<int64_t>(ctx, 1, {coords.rows, 1});
  int64_t* rank = AllocateOutput<int64_t>(ctx, 2, {coords.rows, 1});
  std::copy(sorted.row.begin(), sorted.row.end(), order);
  // The rows copied, not decoded from their sites: a decode is a division per axis.
  ParallelFor(ctx, coords.rows, Grain(coords.width), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::copy_n(coords.Row(order[i]), coords.width, out_coords + i * coords.width);
      rank[order[i]] = i;
    }
  });
}

void SiteOrder::InferShapes(const ShapeContext& ctx) {
  const Shape& coords = ctx.Input(0);
  if (coords.size() != 2) return;
  ctx.SetOutput(0, coords, kInt64);
  ctx.SetOutput(1, {coords[0], 1}, kInt64);
  ctx.SetOutput(2, {coords[0], 1}, kInt64);
}

}  // namespace sparse_lower
