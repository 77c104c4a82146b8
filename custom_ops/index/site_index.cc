// SiteIndex: linear sites of coordinates in a dense [batch_size, C, *spatial_shape] tensor.
#include "index/site_index.h"

#include <algorithm>

#include "common/attributes.h"
#include "common/status.h"
#include "common/tensor.h"

namespace sparse_lower {

SiteIndex::SiteIndex(const Ort::ConstKernelInfo& info)
    : grid_(Required(SpatialShape(info), "spatial_shape")),
      batch_size_(Required(IntAttribute(info, "batch_size"), "batch_size")) {
  if (batch_size_ < 1) Fail("attribute 'batch_size' = ", batch_size_, " must be at least 1");
  if (batch_size_ - 1 > grid_.max_batch) Fail("batch_size ", batch_size_, " makes linear sites overflow int64");
}

void SiteIndex::Compute(const Ort::KernelContext& ctx) const {
  const Coords coords = ReadCoords(ctx, 0, "coords", grid_.Dims());
  const std::vector<int64_t> sites = LinearSites(ctx, coords, grid_, "coords", grid_.max_batch, batch_size_);
  SortSites(sites, coords, "coords");  // refuses duplicates
  std::copy(sites.begin(), sites.end(), AllocateOutput<int64_t>(ctx, 0, {coords.rows}));
}

void SiteIndex::InferShapes(const ShapeContext& ctx) {
  const Shape& coords = ctx.Input(0);
  if (coords.size() == 2) ctx.SetOutput(0, {coords[0]}, kInt64);
}

}  // namespace sparse_lower
