#include "index/neighbour_table.h"

#include "common/tensor.h"

namespace sparse_lower {

NeighbourTable ReadNeighbourTable(const Ort::KernelContext& ctx) {
  const Input<int64_t> nbr = ReadInput<int64_t>(ctx, 0);
  if (nbr.Rank() != 2) Fail("nbr must have shape [M, K], got ", List(nbr.shape));
  const std::vector<int64_t> like = InputShape(ctx, 1);
  if (like.empty()) Fail("like must have shape [N, ...], got a scalar");
  return NeighbourTable{nbr.data, nbr.shape[0], nbr.shape[1], like[0]};
}

}  // namespace sparse_lower
