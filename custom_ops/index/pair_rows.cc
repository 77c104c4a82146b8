// PairRows: features as they are, after checking that they pair row by row with the coords. The nna
// target computes on the features with standard ops that cannot fail, and builds its index tables from
// the coords alone; this is where a features/coords mismatch in the user's feeds is caught.
#include "index/pair_rows.h"

#include <algorithm>

#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"

namespace sparse_lower {

void PairRows::Compute(const Ort::KernelContext& ctx) const {
  const Input<float> features = ReadInput<float>(ctx, 0);
  const std::vector<int64_t> coords = InputShape(ctx, 1);
  if (features.Rank() != 2) Fail("features must have shape [N, C], got ", List(features.shape));
  if (coords.size() != 2) Fail("coords must have shape [N, 1 + D], got ", List(coords));
  if (coords[0] != features.shape[0]) {
    Fail("features have ", features.shape[0], " rows but coords have ", coords[0],
         ": features and coords must pair row by row");
  }
  float* out = AllocateOutput<float>(ctx, 0, features.shape);
  const int64_t channels = features.shape[1];
  ParallelFor(ctx, features.shape[0], Grain(channels), [&](int64_t begin, int64_t end) {
    std::copy(features.data + begin * channels, features.data + end * channels, out + begin * channels);
  });
}

void PairRows::InferShapes(const ShapeContext& ctx) { ctx.SetOutput(0, ctx.Input(0), kFloat); }

}  // namespace sparse_lower
