// SubmanifoldMap, StridedMap, TransposedMap and TargetMap: the same steps on different output sets.
#include "common/tensor.h"
#include "index/index_ops.h"
#include "index/neighbours.h"

namespace sparse_lower {
namespace {

// nbr [rows of input `index`, Π kernel_shape], when both are known.
void InferNeighbourTable(const ShapeContext& ctx, size_t index) {
  const Shape& coords = ctx.Input(index);
  const auto kernel = ctx.Ints("kernel_shape");
  if (coords.size() != 2 || !kernel) return;
  int64_t taps = 1;
  for (const int64_t k : *kernel) {
    if (k < 1 || __builtin_mul_overflow(taps, k, &taps)) return;  // the kernel refuses such attributes
  }
  ctx.SetOutput(0, {coords[0], taps}, kInt64);
}

}  // namespace

void SubmanifoldMap::Compute(const Ort::KernelContext& ctx) const {
  const IndexedInput inputs = ReadIndexedInput(ctx, 0, geometry_);
  int64_t* nbr = AllocateOutput<int64_t>(ctx, 0, {inputs.coords.rows, geometry_.Taps()});
  if (geometry_.Dense()) {  // linear sites of a dense input: arithmetic, no lookups to halve
    GatherNeighbours(ctx, geometry_, inputs.coords, &inputs.sites.row, inputs, nbr);
  } else {
    SubmanifoldNeighbours(ctx, geometry_, inputs, nbr);
  }
}

void SubmanifoldMap::InferShapes(const ShapeContext& ctx) { InferNeighbourTable(ctx, 0); }

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
