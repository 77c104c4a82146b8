// InverseMap: inv[k, i] = the output row m with nbr[m, k] = i, or -1 where none.
#include "index/inverse_map.h"

#include <algorithm>

#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"
#include "index/neighbour_table.h"

namespace sparse_lower {

void InverseMap::Compute(const Ort::KernelContext& ctx) const {
  const NeighbourTable nbr = NeighbourTable::ReadWithLike(ctx);
  int64_t* inv = AllocateOutput<int64_t>(ctx, 0, {nbr.taps, nbr.inputs});
  // One task per tap, writing only its own row of inv: a second read of the same input through the
  // same tap meets the first one's entry, without a race and whatever the scheduling.
  ParallelFor(ctx, nbr.taps, Grain(nbr.rows + nbr.inputs), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      int64_t* row = inv + k * nbr.inputs;
      std::fill(row, row + nbr.inputs, -1);
      for (int64_t m = 0; m < nbr.rows; ++m) {
        const int64_t i = nbr.At(m, k);
        if (i < 0) continue;
        if (row[i] >= 0) {
          Fail("output rows ", row[i], " and ", m, " both read input row ", i, " through tap ", k,
               ", which no convolution does: inv can name only one");
        }
        row[i] = m;
      }
    }
  });
}

void InverseMap::InferShapes(const ShapeContext& ctx) {
  const Shape& nbr = ctx.Input(0);
  const Shape& like = ctx.Input(1);
  if (nbr.size() == 2 && !like.empty()) ctx.SetOutput(0, {nbr[1], like[0]}, kInt64);
}

}  // namespace sparse_lower
