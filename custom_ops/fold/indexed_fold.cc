#include "fold/indexed_fold.h"

#include <algorithm>
#include <vector>

#include "common/attributes.h"
#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"
#include "fold/groups.h"

namespace sparse_lower {
namespace {

// What Y starts from: zeros, input `init` of Y's shape, or `init` [C] on every row (a bias).
class Start {
 public:
  Start(const float* init, bool per_row) : init_(init), per_row_(per_row) {}

  // Rows [begin, end) of Y [targets, C].
  void Fill(float* y, int64_t begin, int64_t end, int64_t channels) const {
    if (init_ == nullptr) {
      std::fill(y + begin * channels, y + end * channels, 0.0f);
    } else if (per_row_) {
      std::copy(init_ + begin * channels, init_ + end * channels, y + begin * channels);
    } else {
      for (int64_t t = begin; t < end; ++t) std::copy_n(init_, channels, y + t * channels);
    }
  }

 private:
  const float* init_ = nullptr;
  bool per_row_ = false;
};

// Y [targets, C] from idx rows that list ascending targets (see AscendingRows): each block of targets
// starts its rows of Y, then adds, row of idx by row, the entries that fall in the block, found by binary
// search. Every target still receives its entries in ascending p.
void FoldAscendingRows(const Ort::KernelContext& ctx, const float* rows, const int64_t* idx,
                       const std::vector<int64_t>& lengths, int64_t width, int64_t channels, int64_t targets,
                       const Start& start, float* y) {
  const auto count = static_cast<int64_t>(lengths.size());
  int64_t entries = 0;
  for (const int64_t length : lengths) entries += length;
  const int64_t work = channels * std::max<int64_t>(1, entries / std::max<int64_t>(targets, 1)) + count;
  ParallelFor(ctx, targets, Grain(work), [&](int64_t begin, int64_t end) {
    start.Fill(y, begin, end, channels);
    for (int64_t r = 0; r < count; ++r) {
      const int64_t* row = idx + r * width;
      const int64_t* stop = row + lengths[r];
      for (const int64_t* p = std::lower_bound(row, stop, begin); p != stop && *p < end; ++p) {
        const float* in = rows + (p - idx) * channels;
        float* out = y + *p * channels;
        for (int64_t c = 0; c < channels; ++c) out[c] += in[c];
      }
    }
  });
}

}  // namespace

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

IndexedFold::Inputs IndexedFold::Read(const Ort::KernelContext& ctx) const {
  Inputs in{ReadInput<float>(ctx, 0), ReadInput<int64_t>(ctx, 1)};
  const Input<float>& rows = in.rows;
  const Input<int64_t>& idx = in.idx;
  if (rows.Rank() != idx.Rank() + 1 || !std::equal(idx.shape.begin(), idx.shape.end(), rows.shape.begin())) {
    Fail("rows must have shape idx.shape + [C] = ", List(idx.shape), " + [C], got ", List(rows.shape));
  }
  in.channels = rows.shape.back();
  if (grid_) {
    if (HasInput(ctx, 2) || HasInput(ctx, 3)) Fail("inputs 'like' and 'init' are for mode 'rows'");
    in.y_shape = {batch_size_, in.channels};
    in.y_shape.insert(in.y_shape.end(), grid_->extent.begin(), grid_->extent.end());
    in.targets = batch_size_ * grid_->volume;
    return in;
  }
  if (!HasInput(ctx, 2)) Fail("mode 'rows' needs input 'like' [M, ...] for the row count of Y");
  const std::vector<int64_t> like = InputShape(ctx, 2);
  if (like.empty()) Fail("like must have shape [M, ...], got a scalar");
  in.y_shape = {like[0], in.channels};
  in.targets = like[0];
  if (HasInput(ctx, 3)) {
    const Input<float> init = ReadInput<float>(ctx, 3);
    const std::vector<int64_t> row{in.channels};
    if (init.shape != in.y_shape && init.shape != row) {
      Fail("init must have the shape of Y ", List(in.y_shape), " or [C] = ", List(row), ", got ", List(init.shape));
    }
    in.init = init.data;
    in.init_rows = init.shape == in.y_shape;
  }
  return in;
}

void IndexedFold::Compute(const Ort::KernelContext& ctx) const {
  const Inputs in = Read(ctx);
  const Input<float>& rows = in.rows;
  const Input<int64_t>& idx = in.idx;
  const int64_t channels = in.channels, targets = in.targets;
  float* y = AllocateOutput<float>(ctx, 0, in.y_shape);
  const int64_t width = idx.Rank() > 0 ? idx.shape.back() : 1;
  const int64_t volume = grid_ ? grid_->volume : 1;
  if (grid_) {
    const int64_t elements = targets * channels;
    ParallelFor(ctx, elements, Grain(1), [&](int64_t begin, int64_t end) { std::fill(y + begin, y + end, 0.0f); });
  } else {
    const Start start(in.init, in.init_rows);
    if (width > 0) {
      if (const auto lengths = AscendingRows(ctx, idx.data, idx.Size() / width, width, targets)) {
        FoldAscendingRows(ctx, rows.data, idx.data, *lengths, width, channels, targets, start, y);
        return;
      }
    }
    ParallelFor(ctx, targets, Grain(channels), [&](int64_t begin, int64_t end) { start.Fill(y, begin, end, channels); });
  }

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
