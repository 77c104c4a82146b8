// ScatterMatrices: S[k, m, i] = 1 where nbr[m, k] = i, else 0.
#include "index/scatter_matrices.h"

#include <algorithm>
#include <string>

#include "common/attributes.h"
#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"
#include "index/neighbour_table.h"

namespace sparse_lower {
namespace {

// S takes K·M·N·4 bytes, quadratic in the active sites: refused above max_bytes before it is allocated.
void CheckSize(const NeighbourTable& nbr, int64_t max_bytes) {
  int64_t bytes = 0;
  const bool overflow = __builtin_mul_overflow(nbr.taps, nbr.rows, &bytes) ||
                        __builtin_mul_overflow(bytes, nbr.inputs, &bytes) ||
                        __builtin_mul_overflow(bytes, int64_t{sizeof(float)}, &bytes);
  if (!overflow && bytes <= max_bytes) return;
  Fail("S [K, M, N] = ", List({nbr.taps, nbr.rows, nbr.inputs}), " takes ",
       overflow ? std::string("more than 2^63") : std::to_string(bytes), " bytes, more than max_bytes = ", max_bytes,
       "; use combine=\"gather\" or \"scatter\", whose tables grow linearly with the sites");
}

}  // namespace

ScatterMatrices::ScatterMatrices(const Ort::ConstKernelInfo& info)
    : max_bytes_(IntAttribute(info, "max_bytes").value_or(int64_t{1} << 30)) {
  if (max_bytes_ < 0) Fail("attribute 'max_bytes' = ", max_bytes_, " must be at least 0");
}

void ScatterMatrices::Compute(const Ort::KernelContext& ctx) const {
  const NeighbourTable nbr = NeighbourTable::ReadWithLike(ctx);
  CheckSize(nbr, max_bytes_);
  float* s = AllocateOutput<float>(ctx, 0, {nbr.taps, nbr.rows, nbr.inputs});
  // One task per row S[k, m, :]: its zeros and its one 1 (if any) are written by that task alone.
  ParallelFor(ctx, nbr.taps * nbr.rows, Grain(nbr.inputs), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = s + r * nbr.inputs;
      std::fill(row, row + nbr.inputs, 0.0f);
      const int64_t i = nbr.At(r % nbr.rows, r / nbr.rows);
      if (i >= 0) row[i] = 1.0f;
    }
  });
}

void ScatterMatrices::InferShapes(const ShapeContext& ctx) {
  const Shape& nbr = ctx.Input(0);
  const Shape& like = ctx.Input(1);
  if (nbr.size() == 2 && !like.empty()) ctx.SetOutput(0, {nbr[1], nbr[0], like[0]}, kFloat);
}

}  // namespace sparse_lower
