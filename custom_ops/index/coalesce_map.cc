// CoalesceMap: the distinct sites of a coordinate table and, per site, the rows that share it.
#include "index/coalesce_map.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/attributes.h"
#include "common/status.h"
#include "common/tensor.h"

namespace sparse_lower {

CoalesceMap::CoalesceMap(const Ort::ConstKernelInfo& info)
    : grid_(Required(SpatialShape(info), "spatial_shape")), members_(IntAttribute(info, "members").value_or(0)) {
  if (members_ < 0) Fail("attribute 'members' = ", members_, " must be at least 0");
}

void CoalesceMap::Compute(const Ort::KernelContext& ctx) const {
  const Coords coords = ReadCoords(ctx, 0, "coords", grid_.Dims());
  const std::vector<int64_t> sites = LinearSites(ctx, coords, grid_, "coords", grid_.max_batch);
  // Rows in site order, the rows of one site in input order (what makes the sums' order fixed).
  std::vector<int64_t> order(sites.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return sites[a] < sites[b]; });
  std::vector<int64_t> distinct;
  std::vector<int64_t> first;  // the position in `order` of each distinct site's first row
  int64_t fullest = 1;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || sites[order[i]] != sites[order[i - 1]]) {
      distinct.push_back(sites[order[i]]);
      first.push_back(static_cast<int64_t>(i));
    }
    fullest = std::max(fullest, static_cast<int64_t>(i) - first.back() + 1);
  }
  if (members_ > 0 && fullest > members_) {
    for (size_t g = 0; g < first.size(); ++g) {
      const int64_t end = g + 1 < first.size() ? first[g + 1] : static_cast<int64_t>(order.size());
      if (end - first[g] > members_) {
        Fail("coords hold ", end - first[g], " rows at the site of row ", order[static_cast<size_t>(first[g])],
             ", more than members = ", members_, " (max_members); raise max_members to at least ", fullest);
      }
    }
  }
  const int64_t width = members_ > 0 ? members_ : fullest;
  const auto count = static_cast<int64_t>(distinct.size());
  int64_t* out_coords = AllocateOutput<int64_t>(ctx, 0, {count, static_cast<int64_t>(coords.width)});
  WriteCoords(ctx, distinct, grid_, out_coords);
  int64_t* table = AllocateOutput<int64_t>(ctx, 1, {count, width});
  std::fill(table, table + count * width, int64_t{-1});
  for (int64_t g = 0; g < count; ++g) {
    const int64_t end = g + 1 < count ? first[g + 1] : static_cast<int64_t>(order.size());
    for (int64_t i = first[g]; i < end; ++i) table[g * width + (i - first[g])] = order[i];
  }
}

void CoalesceMap::InferShapes(const ShapeContext&) {
  // Both outputs' row counts depend on the data: onnxruntime is told their types only.
}

}  // namespace sparse_lower
