#include "index/neighbour_table.h"

#include <limits>
#include <vector>

#include "common/op.h"
#include "common/status.h"
#include "common/tensor.h"

namespace sparse_lower {

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

NeighbourTable NeighbourTable::Read(const Ort::KernelContext& ctx) {
  const Input<int64_t> nbr = ReadInput<int64_t>(ctx, 0);
  if (nbr.Rank() != 2) Fail("nbr must have shape [M, K], got ", List(nbr.shape));
  return NeighbourTable(nbr.data, nbr.shape[0], nbr.shape[1], -1);
}

NeighbourTable NeighbourTable::ReadWithLike(const Ort::KernelContext& ctx) {
  const NeighbourTable nbr = Read(ctx);
  const std::vector<int64_t> like = InputShape(ctx, 1);
  if (like.empty()) Fail("like must have shape [N, ...], got a scalar");
  return NeighbourTable(nbr.data, nbr.rows, nbr.taps, like[0]);
}

NeighbourTable::NeighbourTable(const int64_t* data, int64_t rows, int64_t taps, int64_t inputs)
    : data(data),
      rows(rows),
      taps(taps),
      inputs(inputs),
      last_row_(inputs < 0 ? std::numeric_limits<int64_t>::max() : inputs - 1) {}

void NeighbourTable::Refuse(int64_t m, int64_t k, int64_t row) const {
  if (inputs < 0) Fail("nbr[", m, ", ", k, "] = ", row, " is neither a row index nor -1");
  Fail("nbr[", m, ", ", k, "] = ", row, " is neither -1 nor a row of like, in [0, ", inputs, ")");
}

}  // namespace sparse_lower
