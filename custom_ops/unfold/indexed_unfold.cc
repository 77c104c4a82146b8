#include "unfold/indexed_unfold.h"

#include <algorithm>

#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"

namespace sparse_lower {
namespace {

// The sites per batch of a dense X: the product of its spatial dimensions.
int64_t SpatialVolume(const Input<float>& x) {
  int64_t volume = 1;
  for (size_t d = 2; d < x.shape.size(); ++d) {
    if (__builtin_mul_overflow(volume, x.shape[d], &volume)) Fail("X of shape ", List(x.shape), " has too many sites");
  }
  return volume;
}

// Checks X against the attribute and the coords input; returns how many inputs idx may name.
int64_t CheckInputs(const Ort::KernelContext& ctx, const Input<float>& x, const std::optional<Grid>& grid) {
  if (x.Rank() == 2) {
    if (grid) Fail("attribute 'spatial_shape' is for a dense X [B, C, *S], but X has shape ", List(x.shape));
    CheckCoordsPairing(ctx, 2, x.shape[0]);
    return x.shape[0];
  }
  if (x.Rank() < 3) Fail("X must be rows [N, C] or dense [B, C, *S], got shape ", List(x.shape));
  if (grid && !std::equal(x.shape.begin() + 2, x.shape.end(), grid->extent.begin(), grid->extent.end())) {
    Fail("X has shape ", List(x.shape), ", its spatial dimensions differ from spatial_shape ", List(grid->extent));
  }
  if (HasInput(ctx, 2)) Fail("coords pairs with row features X [N, C], but X is dense");
  int64_t sites = 0;
  if (__builtin_mul_overflow(x.shape[0], SpatialVolume(x), &sites)) {
    Fail("X of shape ", List(x.shape), " has too many sites");
  }
  return sites;
}

}  // namespace

IndexedUnfold::Inputs IndexedUnfold::Read(const Ort::KernelContext& ctx) const {
  Inputs in{ReadInput<float>(ctx, 0), ReadInput<int64_t>(ctx, 1)};
  in.limit = CheckInputs(ctx, in.x, grid_);
  if (in.idx.Rank() < 1) Fail("idx must have shape [..., K], got a scalar");
  in.taps = in.idx.shape.back();
  in.rows = in.idx.Size() / std::max<int64_t>(in.taps, 1);
  in.channels = in.x.shape[1];
  in.y_shape = in.idx.shape;
  in.y_shape.back() = in.taps * in.channels;
  in.dense = in.x.Rank() > 2;
  in.volume = in.dense ? SpatialVolume(in.x) : 1;
  return in;
}

void IndexedUnfold::Compute(const Ort::KernelContext& ctx) const {
  const Inputs in = Read(ctx);
  const Input<float>& x = in.x;
  const Input<int64_t>& idx = in.idx;
  const int64_t limit = in.limit, taps = in.taps, rows = in.rows, channels = in.channels, volume = in.volume;
  const bool dense = in.dense;
  float* y = AllocateOutput<float>(ctx, 0, in.y_shape);
  ParallelFor(ctx, rows, Grain(taps * channels), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t k = 0; k < taps; ++k) {
        const int64_t source = idx.data[r * taps + k];
        float* out = y + (r * taps + k) * channels;
        if (source == -1) {
          std::fill(out, out + channels, 0.0f);
        } else if (source < 0 || source >= limit) {
          Fail("idx value ", source, " (row ", r, ", tap ", k, ") is outside [0, ", limit, "), the ",
               dense ? "sites" : "rows", " of X; only -1 marks a missing input");
        } else if (!dense) {
          std::copy_n(x.data + source * channels, channels, out);
        } else {  // channel c of site b·V + position lies at X[b, c, position]
          const float* from = x.data + (source / volume) * channels * volume + source % volume;
          for (int64_t c = 0; c < channels; ++c) out[c] = from[c * volume];
        }
      }
    }
  });
}

void IndexedUnfold::InferShapes(const ShapeContext& ctx) {
  const Shape& x = ctx.Input(0);
  Shape y = ctx.Input(1);
  if (x.size() < 2 || y.empty() || x[1].value < 0 || y.back().value < 0) return;  // symbols have no value
  y.back() = Dim(y.back().value * x[1].value);
  ctx.SetOutput(0, y, kFloat);
}

}  // namespace sparse_lower
