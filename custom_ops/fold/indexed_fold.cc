#include "fold/indexed_fold.h"

#include <algorithm>

#include "common/attributes.h"
#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"
#include "fold/groups.h"

namespace sparse_lower {

IndexedFold::IndexedFold(const Ort::ConstKernelInfo& info) {
  const bool dense = Choice(info, "mode", {"rows", "dense"}) == 1;
  const std::optional<int64_t> batch_size = IntAttribute(info, "batch_size");
  grid_ = SpatialShape(info);
  if (!dense) {
    if (grid_ || batch_size) Fail("attributes 'spatial_shape' and 'batch_size' are for mode 'dense'");
    return;
  }
  if (!grid_) Fail("mode 'dense' needs attribute 'spatial_shape'");
  batch_size_ = Required(batch_size, "batch_size");
  if (batch_size_ < 1) Fail("attribute 'batch_size' = ", batch_size_, " must be at least 1");
  if (batch_size_ - 1 > grid_->max_batch) Fail("batch_size ", batch_size_, " makes linear sites overflow int64");
}

void IndexedFold::Compute(const Ort::KernelContext& ctx) const {
  const Input<float> rows = ReadInput<float>(ctx, 0);
  const Input<int64_t> idx = ReadInput<int64_t>(ctx, 1);
  if (rows.Rank() != idx.Rank() + 1 || !std::equal(idx.shape.begin(), idx.shape.end(), rows.shape.begin())) {
    Fail("rows must have shape idx.shape + [C] = ", List(idx.shape), " + [C], got ", List(rows.shape));
  }
  const int64_t channels = rows.shape.back();
  std::vector<int64_t> shape;
  int64_t targets = 0;
  if (grid_) {
    if (HasInput(ctx, 2)) Fail("input 'like' is for mode 'rows'");
    shape = {batch_size_, channels};
    shape.insert(shape.end(), grid_->extent.begin(), grid_->extent.end());
    targets = batch_size_ * grid_->volume;
  } else {
    if (!HasInput(ctx, 2)) Fail("mode 'rows' needs input 'like' [M, ...] for the row count of Y");
    const std::vector<int64_t> like = InputShape(ctx, 2);
    if (like.empty()) Fail("like must have shape [M, ...], got a scalar");
    shape = {like[0], channels};
    targets = like[0];
  }
  float* y = AllocateOutput<float>(ctx, 0, shape);
  const int64_t volume = grid_ ? grid_->volume : 1;
  const int64_t elements = targets * channels;
  ParallelFor(ctx, elements, Grain(1), [&](int64_t begin, int64_t end) { std::fill(y + begin, y + end, 0.0f); });

  const Groups groups = GroupByTarget(idx.data, idx.Size(), targets);
  const auto count = static_cast<int64_t>(groups.target.size());
  const int64_t work = channels * std::max<int64_t>(1, idx.Size() / std::max<int64_t>(count, 1));
  ParallelFor(ctx, count, Grain(work), [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t t = groups.target[g];
      // Row t of Y, or for mode dense site t = b·V + position, channel c at Y[b, c, position].
      float* out = y + (t / volume) * channels * volume + t % volume;
      for (int64_t i = groups.start[g]; i < groups.start[g + 1]; ++i) {
        const float* in = rows.data + groups.entry[i] * channels;
        for (int64_t c = 0; c < channels; ++c) out[c * volume] += in[c];
      }
    }
  });
}

void IndexedFold::InferShapes(const ShapeContext& ctx) {
  const Shape& rows = ctx.Input(0);
  if (rows.empty()) return;
  if (ctx.String("mode").value_or("rows") == "dense") {
    const auto extent = ctx.Ints("spatial_shape");
    const auto batch_size = ctx.Int("batch_size");
    if (!extent || !batch_size) return;
    Shape y{*batch_size, rows.back()};
    y.insert(y.end(), extent->begin(), extent->end());
    ctx.SetOutput(0, y, kFloat);
  } else if (ctx.InputCount() > 2 && !ctx.Input(2).empty()) {
    ctx.SetOutput(0, {ctx.Input(2)[0], rows.back()}, kFloat);
  }
}

}  // namespace sparse_lower
