// ReachedMap, the kernel of StridedMap and TransposedMap: the outputs found from the inputs they reach.
#include "index/reached_map.h"

#include <numeric>

#include "common/coords.h"
#include "common/tensor.h"
#include "index/neighbours.h"
#include "index/site_bits.h"

namespace sparse_lower {

bool ReachedMap::Filled(int64_t inputs, int64_t outputs) const {
  // An input reaches about K / Πs (output, tap) slots of a convolution, so the table holds about N / (M·Πs)
  // of its slots filled. In double: M·Πs can pass int64.
  auto reach = static_cast<double>(outputs);
  for (const Axis& axis : geometry_.Axes()) reach *= static_cast<double>(axis.stride);
  return 9.0 * static_cast<double>(inputs) >= reach;
}

void ReachedMap::Compute(const Ort::KernelContext& ctx) const {
  const IndexedInput inputs = ReadIndexedInput(ctx, 0, geometry_);
  const auto width = static_cast<int64_t>(1 + geometry_.Dims());
  if (!geometry_.Dense() && SiteBits::Fit(geometry_, inputs)) {
    const SiteBits bits(ctx, geometry_, inputs);
    int64_t* out_coords = AllocateOutput<int64_t>(ctx, 0, {bits.Count(), width});
    bits.WriteCoords(ctx, geometry_.Out(), out_coords);
    int64_t* nbr = AllocateOutput<int64_t>(ctx, 1, {bits.Count(), geometry_.Taps()});
    if (geometry_.Transposed() || !Filled(inputs.coords.rows, bits.Count())) {
      bits.ScatterNeighbours(ctx, geometry_, inputs, nbr);
    } else {  // each output's taps looked up, a grid line at a time: nbr written once, row by row
      SortedSites outputs{bits.Sites(ctx), std::vector<int64_t>(static_cast<size_t>(bits.Count()))};
      std::iota(outputs.row.begin(), outputs.row.end(), int64_t{0});
      LineNeighbours(ctx, geometry_, Coords{out_coords, bits.Count(), width}, outputs, inputs, nbr);
    }
    return;
  }
  const ReachedOutputs reached = ReachOutputs(ctx, geometry_, inputs);
  const auto count = static_cast<int64_t>(reached.sites.size());
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
