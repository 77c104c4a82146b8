// TargetMap: nbr [M, K] of given output coordinates, each tap's input looked up (a transposed geometry).
#include "index/target_map.h"

#include <vector>

#include "common/attributes.h"
#include "common/coords.h"
#include "common/sorted_sites.h"
#include "common/tensor.h"
#include "index/neighbour_table.h"
#include "index/neighbours.h"

namespace sparse_lower {

MapKind TargetMap::Kind(const Ort::ConstKernelInfo& info) {
  const int64_t transposed = IntAttribute(info, "transposed").value_or(1);
  if (transposed != 0 && transposed != 1) Fail("attribute 'transposed' = ", transposed, " must be 0 or 1");
  return transposed ? MapKind::kTransposed : MapKind::kStrided;
}

void TargetMap::Compute(const Ort::KernelContext& ctx) const {
  const IndexedInput inputs = ReadIndexedInput(ctx, 0, geometry_);
  const Coords targets = ReadCoords(ctx, 1, "target_coords", geometry_.Dims());
  const std::vector<int64_t> sites = LinearSites(ctx, targets, geometry_.Out(), "target_coords", geometry_.MaxBatch());
  const SortedSites sorted = SortSites(sites, targets, "target_coords");  // refuses duplicated targets
  int64_t* nbr = AllocateOutput<int64_t>(ctx, 0, {targets.rows, geometry_.Taps()});
  GatherNeighbours(ctx, geometry_, targets, &sorted.row, inputs, nbr);
}

void TargetMap::InferShapes(const ShapeContext& ctx) { InferNeighbourTable(ctx, 1); }

}  // namespace sparse_lower
