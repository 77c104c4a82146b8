// Rulebook: for each tap k, the pairs (nbr[m, k], m) with nbr[m, k] ≥ 0 in ascending m, padded with -1.
#include <algorithm>

#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"
#include "index/index_ops.h"

namespace sparse_lower {

void Rulebook::Compute(const Ort::KernelContext& ctx) const {
  const Input<int64_t> nbr = ReadInput<int64_t>(ctx, 0);
  if (nbr.Rank() != 2) Fail("nbr must have shape [M, K], got ", List(nbr.shape));
  const int64_t rows = nbr.shape[0];
  const int64_t taps = nbr.shape[1];
  const int64_t grain = Grain(taps);
  const int64_t blocks = BlockCount(rows, grain);

  // Pass 1, per block of rows: the pair count of every tap.
  std::vector<int64_t> next(static_cast<size_t>(blocks * taps), 0);
  ParallelBlocks(ctx, blocks, [&](int64_t block) {
    int64_t* count = next.data() + block * taps;
    for (int64_t m = block * grain; m < std::min(rows, (block + 1) * grain); ++m) {
      for (int64_t k = 0; k < taps; ++k) {
        const int64_t row = nbr.data[m * taps + k];
        if (row < -1) Fail("nbr[", m, ", ", k, "] = ", row, " is neither a row index nor -1");
        count[k] += row >= 0;
      }
    }
  });
  // Each block writes a tap's pairs after those of the blocks before it: ascending m, no race.
  std::vector<int64_t> total(static_cast<size_t>(taps), 0);
  for (int64_t block = 0; block < blocks; ++block) {
    for (int64_t k = 0; k < taps; ++k) {
      const int64_t count = next[block * taps + k];
      next[block * taps + k] = total[k];
      total[k] += count;
    }
  }
  const int64_t pairs = taps > 0 ? *std::max_element(total.begin(), total.end()) : 0;
  int64_t* in_rows = AllocateOutput<int64_t>(ctx, 0, {taps, pairs});
  int64_t* out_rows = AllocateOutput<int64_t>(ctx, 1, {taps, pairs});

  // Pass 2: place the pairs, then pad every tap to P.
  ParallelBlocks(ctx, blocks, [&](int64_t block) {
    int64_t* position = next.data() + block * taps;
    for (int64_t m = block * grain; m < std::min(rows, (block + 1) * grain); ++m) {
      for (int64_t k = 0; k < taps; ++k) {
        const int64_t row = nbr.data[m * taps + k];
        if (row < 0) continue;
        const int64_t slot = k * pairs + position[k]++;
        in_rows[slot] = row;
        out_rows[slot] = m;
      }
    }
  });
  ParallelFor(ctx, taps, Grain(pairs), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      std::fill(in_rows + k * pairs + total[k], in_rows + (k + 1) * pairs, -1);
      std::fill(out_rows + k * pairs + total[k], out_rows + (k + 1) * pairs, -1);
    }
  });
}

}  // namespace sparse_lower
