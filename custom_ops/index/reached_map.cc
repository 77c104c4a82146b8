// ReachedMap, the kernel of StridedMap and TransposedMap: the outputs found from the inputs they reach.
#include "index/reached_map.h"

#include "common/coords.h"
#include "common/tensor.h"
#include "index/neighbours.h"

namespace sparse_lower {

void ReachedMap::Compute(const Ort::KernelContext& ctx) const {
  const IndexedInput inputs = ReadIndexedInput(ctx, 0, geometry_);
  const ReachedOutputs reached = ReachOutputs(ctx, geometry_, inputs);
  const auto count = static_cast<int64_t>(reached.sites.size());
  const auto width = static_cast<int64_t>(1 + geometry_.Dims());
  int64_t* out_coords = AllocateOutput<int64_t>(ctx, 0, {count, width});
  WriteCoords(ctx, reached.sites, geometry_.Out(), out_coords);
  int64_t* nbr = AllocateOutput<int64_t>(ctx, 1, {count, geometry_.Taps()});
  if (geometry_.Dense()) {  // every tap inside the input grid, active or not: arithmetic on out_coords
    GatherNeighbours(ctx, geometry_, Coords{out_coords, count, width}, nullptr, inputs, nbr);
  } else {
    ScatterNeighbours(ctx, reached, nbr);
  }
}

}  // namespace sparse_lower
