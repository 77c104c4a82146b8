// SubmanifoldMap: nbr [N, K] of the active sites themselves, each tap looked up around its row.
#include "index/submanifold_map.h"

#include "common/tensor.h"
#include "index/neighbour_table.h"
#include "index/neighbours.h"

namespace sparse_lower {

void SubmanifoldMap::Compute(const Ort::KernelContext& ctx) const {
  const IndexedInput inputs = ReadIndexedInput(ctx, 0, geometry_);
  int64_t* nbr = AllocateOutput<int64_t>(ctx, 0, {inputs.coords.rows, geometry_.Taps()});
  if (geometry_.Dense()) {  // linear sites of a dense input: arithmetic, no lookups to halve
    GatherNeighbours(ctx, geometry_, inputs.coords, &inputs.sites.row, inputs, nbr);
  } else {
    LineNeighbours(ctx, geometry_, inputs.coords, inputs.sites, inputs, nbr);
  }
}

void SubmanifoldMap::InferShapes(const ShapeContext& ctx) { InferNeighbourTable(ctx, 0); }

}  // namespace sparse_lower
