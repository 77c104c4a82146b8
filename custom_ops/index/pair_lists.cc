// PairLists: per tap, the input rows that have a partner (in output order, then the zero row), and
// each output's position in its tap's list.
#include "index/pair_lists.h"

#include <algorithm>
#include <vector>

#include "common/attributes.h"
#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"
#include "index/neighbour_table.h"

namespace sparse_lower {

namespace {
constexpr int64_t kRowsPerBlock = 4096;
}  // namespace

PairLists::PairLists(const Ort::ConstKernelInfo& info)
    : capacities_(IntsAttribute(info, "capacities")),
      option_(StringAttribute(info, "option").value_or("max_pairs")) {
  if (capacities_) {
    for (const int64_t c : *capacities_) {
      if (c < 0) Fail("attribute 'capacities' holds ", c, "; each must be at least 0");
    }
  }
}

void PairLists::Compute(const Ort::KernelContext& ctx) const {
  const NeighbourTable nbr = NeighbourTable::ReadWithLike(ctx);
  const int64_t taps = nbr.taps;
  if (capacities_ && static_cast<int64_t>(capacities_->size()) != taps) {
    Fail("attribute 'capacities' has ", capacities_->size(), " entries for the ", taps, " taps of nbr");
  }
  // nbr is read row by row (it is [M, K] row-major), in fixed blocks of rows: pass 1 counts each block's
  // pairs per tap, a prefix sum over blocks gives each block where its pairs go, pass 2 writes them.
  const int64_t blocks = (nbr.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<int64_t> before(static_cast<size_t>((blocks + 1) * taps), 0);  // [block][tap]: pairs of earlier blocks
  ParallelBlocks(ctx, blocks, [&](int64_t block) {
    int64_t* count = before.data() + (block + 1) * taps;
    for (int64_t m = block * kRowsPerBlock, end = std::min(nbr.rows, m + kRowsPerBlock); m < end; ++m) {
      for (int64_t k = 0; k < taps; ++k) count[k] += nbr.At(m, k) >= 0;
    }
  });
  for (int64_t block = 1; block <= blocks; ++block) {
    for (int64_t k = 0; k < taps; ++k) before[block * taps + k] += before[(block - 1) * taps + k];
  }
  const int64_t* counts = before.data() + blocks * taps;
  int64_t* offsets = AllocateOutput<int64_t>(ctx, 2, {taps + 1});
  offsets[0] = 0;
  for (int64_t k = 0; k < taps; ++k) {
    if (capacities_ && counts[k] > (*capacities_)[k]) {
      Fail("tap ", k, " has ", counts[k], " pairs, more than the capacity ", (*capacities_)[k], " (", option_, "[", k,
           "]); raise ", option_, "[", k, "] to at least ", counts[k]);
    }
    offsets[k + 1] = offsets[k] + (capacities_ ? (*capacities_)[k] : counts[k]) + 1;
  }
  int64_t* sources = AllocateOutput<int64_t>(ctx, 0, {offsets[taps]});
  int64_t* positions = AllocateOutput<int64_t>(ctx, 1, {taps, nbr.rows});
  ParallelBlocks(ctx, blocks, [&](int64_t block) {
    std::vector<int64_t> next(before.begin() + block * taps, before.begin() + (block + 1) * taps);
    for (int64_t m = block * kRowsPerBlock, end = std::min(nbr.rows, m + kRowsPerBlock); m < end; ++m) {
      for (int64_t k = 0; k < taps; ++k) {
        const int64_t i = nbr.data[m * taps + k];  // checked in pass 1
        if (i >= 0) {
          sources[offsets[k] + next[k]] = i;
          positions[k * nbr.rows + m] = next[k]++;
        } else {
          positions[k * nbr.rows + m] = counts[k];  // the block's first zero row
        }
      }
    }
  });
  for (int64_t k = 0; k < taps; ++k) std::fill(sources + offsets[k] + counts[k], sources + offsets[k + 1], nbr.inputs);
}

void PairLists::InferShapes(const ShapeContext& ctx) {
  // Only under capacities are the lists' lengths known before the run.
  if (const auto capacities = ctx.Ints("capacities")) {
    int64_t total = 0;
    for (const int64_t c : *capacities) total += c + 1;
    ctx.SetOutput(0, {total}, kInt64);
    ctx.SetOutput(2, {static_cast<int64_t>(capacities->size()) + 1}, kInt64);
  }
  const Shape& nbr = ctx.Input(0);
  if (nbr.size() == 2) ctx.SetOutput(1, {nbr[1], nbr[0]}, kInt64);
}

}  // namespace sparse_lower
