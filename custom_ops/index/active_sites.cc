// ActiveSites: the sites of a dense [B, C, *S] tensor where any channel is non-zero, sorted.
#include "index/active_sites.h"

#include <algorithm>

#include "common/coords.h"
#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"

namespace sparse_lower {

ActiveSites::DenseInput ActiveSites::Read(const Ort::KernelContext& ctx) {
  const Input<float> x = ReadInput<float>(ctx, 0);
  if (x.Rank() < 3 || x.Rank() > 5) {
    Fail("X must have shape [B, C, *S] with 1 to 3 spatial dimensions, got ", List(x.shape));
  }
  DenseInput in{x, Grid(std::vector<int64_t>(x.shape.begin() + 2, x.shape.end()), "grid"), x.shape[0], x.shape[1], 0};
  // B·V sites; may exceed the element count when C = 0
  if (__builtin_mul_overflow(in.batch, in.grid.volume, &in.total)) Fail("X of shape ", List(x.shape), " has too many sites");
  if (in.channels == 0) in.total = 0;
  return in;
}

void ActiveSites::Compute(const Ort::KernelContext& ctx) const {
  const DenseInput in = Read(ctx);
  const Input<float>& x = in.x;
  const Grid& grid = in.grid;
  const int64_t channels = in.channels, volume = grid.volume, total = in.total;

  // Pass 1, per block of sites: the active ones, found channel by channel over contiguous memory.
  const int64_t grain = Grain(channels);
  std::vector<std::vector<int64_t>> found(static_cast<size_t>(BlockCount(total, grain)));
  ParallelBlocks(ctx, static_cast<int64_t>(found.size()), [&](int64_t block) {
    const int64_t begin = block * grain;
    const int64_t end = std::min(total, begin + grain);
    std::vector<uint8_t> active(static_cast<size_t>(end - begin), 0);
    for (int64_t start = begin; start < end;) {  // one batch at a time
      const int64_t b = start / volume;
      const int64_t stop = std::min(end, (b + 1) * volume);
      for (int64_t c = 0; c < channels; ++c) {
        const float* values = x.data + (b * channels + c) * volume - b * volume;
        for (int64_t s = start; s < stop; ++s) active[s - begin] |= values[s] != 0.0f;  // NaN is non-zero
      }
      start = stop;
    }
    for (int64_t s = begin; s < end; ++s) {
      if (active[s - begin]) found[block].push_back(s);
    }
  });

  // Pass 2: every block writes its sites after those of the blocks before it.
  std::vector<int64_t> offset(found.size() + 1, 0);
  for (size_t block = 0; block < found.size(); ++block) offset[block + 1] = offset[block] + found[block].size();
  const int64_t count = offset.back();
  const auto width = static_cast<int64_t>(1 + grid.Dims());
  int64_t* coords = AllocateOutput<int64_t>(ctx, 0, {count, width});
  int64_t* sites = AllocateOutput<int64_t>(ctx, 1, {count, 1});
  ParallelBlocks(ctx, static_cast<int64_t>(found.size()), [&](int64_t block) {
    for (size_t i = 0; i < found[block].size(); ++i) {
      const int64_t n = offset[block] + static_cast<int64_t>(i);
      sites[n] = found[block][i];
      grid.Decode(found[block][i], coords + n * width);
    }
  });
}

}  // namespace sparse_lower
