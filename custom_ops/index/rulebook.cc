// Rulebook: the pairs (nbr[m, k], m) with nbr[m, k] ≥ 0 of every tap, in ascending m, the taps put in
// groups of similar pair counts and each group padded with -1 to its largest count.
//
// Why groups: one batched MatMul per group multiplies Kg·Pg rows. A single group pads every tap to the
// fullest one (a submanifold conv's centre tap has all M rows, while the nuScenes frames fill 11–88 %
// of the other taps), which wastes as much as the unfold does; a few groups sized from the actual counts
// waste a few per cent.
#include "index/rulebook.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "common/attributes.h"
#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"
#include "index/neighbour_table.h"

namespace sparse_lower {
namespace {

constexpr int64_t kMaxGroups = 64;
constexpr int64_t kMaxOptimalTaps = 1024;  // beyond, an O(groups · taps²) search would be slow

// Where each group starts in `counts` (sorted descending, n > groups): the split into `groups` runs
// minimising Σ run length · first count, the pairs the MatMuls process padding included. Exact by
// dynamic programming up to kMaxOptimalTaps taps; beyond that, runs of equal length.
std::vector<int64_t> RunStarts(const std::vector<int64_t>& counts, int64_t groups) {
  const auto n = static_cast<int64_t>(counts.size());
  std::vector<int64_t> starts(static_cast<size_t>(groups));
  if (n > kMaxOptimalTaps) {
    for (int64_t g = 0; g < groups; ++g) starts[g] = g * n / groups;
    return starts;
  }
  // cost[j]: the least padded size of the first j taps in the groups so far (defined for j ≥ groups so
  // far); from[g][j]: where the last of g + 1 groups covering them starts.
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> cost(static_cast<size_t>(n + 1), kNone);
  std::vector<std::vector<int64_t>> from(static_cast<size_t>(groups), std::vector<int64_t>(n + 1, 0));
  for (int64_t j = 1; j <= n; ++j) cost[j] = j * counts[0];
  for (int64_t g = 1; g < groups; ++g) {
    std::vector<int64_t> next(static_cast<size_t>(n + 1), kNone);
    for (int64_t j = g + 1; j <= n; ++j) {
      for (int64_t i = g; i < j; ++i) {  // cost[i] is defined: i ≥ g
        const int64_t candidate = cost[i] + (j - i) * counts[i];
        if (candidate < next[j]) {
          next[j] = candidate;
          from[g][j] = i;
        }
      }
    }
    cost = std::move(next);
  }
  for (int64_t g = groups - 1, end = n; g >= 0; --g) {
    starts[g] = from[g][end];
    end = starts[g];
  }
  return starts;
}

// nbr's rows in blocks of `grain`: pass 1 counts each tap's pairs block by block, pass 2 places them.
struct RowBlocks {
  int64_t grain;
  int64_t count;
  int64_t Begin(int64_t block) const { return block * grain; }
  int64_t End(int64_t block, int64_t rows) const { return std::min(rows, (block + 1) * grain); }
};

// Per tap, the pairs (nbr[m, k] ≥ 0) in all, and where each block's first pair of the tap goes: after
// those of the blocks before it, so that pass 2 writes ascending m without a race.
struct PairCounts {
  std::vector<int64_t> total;  // [taps]
  std::vector<int64_t> next;   // [blocks, taps]
};

// Pass 1, per block of rows: the pair count of every tap, checking every entry of nbr; then the offsets.
PairCounts CountPairs(const Ort::KernelContext& ctx, const NeighbourTable& nbr, const RowBlocks& blocks) {
  const int64_t taps = nbr.taps;
  PairCounts counts{std::vector<int64_t>(static_cast<size_t>(taps), 0),
                    std::vector<int64_t>(static_cast<size_t>(blocks.count * taps), 0)};
  ParallelBlocks(ctx, blocks.count, [&](int64_t block) {
    int64_t* count = counts.next.data() + block * taps;
    for (int64_t m = blocks.Begin(block); m < blocks.End(block, nbr.rows); ++m) {
      for (int64_t k = 0; k < taps; ++k) count[k] += nbr.At(m, k) >= 0;
    }
  });
  for (int64_t block = 0; block < blocks.count; ++block) {
    for (int64_t k = 0; k < taps; ++k) {
      const int64_t count = counts.next[block * taps + k];
      counts.next[block * taps + k] = counts.total[k];
      counts.total[k] += count;
    }
  }
  return counts;
}

// The taps with pairs and not skipped, fullest first (ties by tap), and where each non-empty group
// starts among them.
struct TapGroups {
  std::vector<int64_t> order;   // the taps
  std::vector<int64_t> counts;  // their pair counts, descending
  std::vector<int64_t> starts;  // [filled]: the groups after these stay empty
};

TapGroups GroupTaps(const std::vector<int64_t>& total, const std::vector<int64_t>& skip_taps, int64_t groups) {
  const auto taps = static_cast<int64_t>(total.size());
  std::vector<bool> skipped(static_cast<size_t>(taps), false);
  for (const int64_t k : skip_taps) skipped[k] = true;
  TapGroups grouped;
  for (int64_t k = 0; k < taps; ++k) {
    if (total[k] > 0 && !skipped[k]) grouped.order.push_back(k);
  }
  std::vector<int64_t>& order = grouped.order;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return total[a] > total[b]; });
  const auto used = static_cast<int64_t>(order.size());
  const int64_t filled = std::min(groups, used);
  grouped.counts.resize(order.size());
  std::transform(order.begin(), order.end(), grouped.counts.begin(), [&](int64_t k) { return total[k]; });
  grouped.starts.resize(static_cast<size_t>(filled));
  if (filled == used) {
    std::iota(grouped.starts.begin(), grouped.starts.end(), int64_t{0});
  } else {
    grouped.starts = RunStarts(grouped.counts, filled);
  }
  return grouped;
}

// Where a tap's pairs go: its row of its group's in_rows and out_rows, `pairs` wide (null: not placed).
struct Placement {
  int64_t* in_rows = nullptr;
  int64_t* out_rows = nullptr;
  int64_t pairs = 0;
};

// Allocates each of the `groups` groups' outputs; each member tap's rows, in ascending tap order, are its
// placement.
std::vector<Placement> AllocateGroups(const Ort::KernelContext& ctx, const TapGroups& grouped, int64_t groups,
                                      int64_t taps) {
  const auto used = static_cast<int64_t>(grouped.order.size());
  const auto filled = static_cast<int64_t>(grouped.starts.size());
  std::vector<Placement> placement(static_cast<size_t>(taps));
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g < filled ? grouped.starts[g] : used;
    const int64_t end = g + 1 < filled ? grouped.starts[g + 1] : used;
    std::vector<int64_t> members(grouped.order.begin() + begin, grouped.order.begin() + end);
    std::sort(members.begin(), members.end());
    const int64_t width = members.empty() ? 0 : grouped.counts[begin];
    const auto size = static_cast<int64_t>(members.size());
    int64_t* in_rows = AllocateOutput<int64_t>(ctx, 3 * g, {size, width});
    int64_t* out_rows = AllocateOutput<int64_t>(ctx, 3 * g + 1, {size, width});
    std::copy(members.begin(), members.end(), AllocateOutput<int64_t>(ctx, 3 * g + 2, {size}));
    for (int64_t a = 0; a < size; ++a) {
      placement[members[a]] = Placement{in_rows + a * width, out_rows + a * width, width};
    }
  }
  return placement;
}

// Pass 2: every placed tap's pairs at the positions pass 1 counted (`next`, advanced here).
void PlacePairs(const Ort::KernelContext& ctx, const NeighbourTable& nbr, const RowBlocks& blocks,
                std::vector<int64_t>& next, const std::vector<Placement>& placement) {
  const int64_t taps = nbr.taps;
  ParallelBlocks(ctx, blocks.count, [&](int64_t block) {
    int64_t* position = next.data() + block * taps;
    for (int64_t m = blocks.Begin(block); m < blocks.End(block, nbr.rows); ++m) {
      for (int64_t k = 0; k < taps; ++k) {
        const int64_t row = nbr.data[m * taps + k];  // checked in pass 1
        const Placement& place = placement[k];
        if (row < 0 || place.in_rows == nullptr) continue;
        const int64_t slot = position[k]++;
        place.in_rows[slot] = row;
        place.out_rows[slot] = m;
      }
    }
  });
}

// Every placed tap's rows past its pairs, up to its group's width, set to -1.
void PadTaps(const Ort::KernelContext& ctx, const std::vector<int64_t>& total,
             const std::vector<Placement>& placement) {
  ParallelFor(ctx, static_cast<int64_t>(placement.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const Placement& place = placement[k];
      if (place.in_rows == nullptr) continue;
      std::fill(place.in_rows + total[k], place.in_rows + place.pairs, -1);
      std::fill(place.out_rows + total[k], place.out_rows + place.pairs, -1);
    }
  });
}

}  // namespace

Rulebook::Rulebook(const Ort::ConstKernelInfo& info)
    : groups_(IntAttribute(info, "groups").value_or(1)),
      skip_taps_(IntsAttribute(info, "skip_taps").value_or(std::vector<int64_t>{})) {
  if (groups_ < 1 || groups_ > kMaxGroups) {
    Fail("attribute 'groups' = ", groups_, " must lie in [1, ", kMaxGroups, "]");
  }
  for (const int64_t k : skip_taps_) {
    if (k < 0) Fail("attribute 'skip_taps' holds ", k, ": taps are ≥ 0");
  }
  if (static_cast<int64_t>(info.GetOutputCount()) != 3 * groups_) {
    Fail("a rulebook of ", groups_, " groups has ", 3 * groups_,
         " outputs (in_rows, out_rows, taps per group), the node has ", info.GetOutputCount());
  }
}

void Rulebook::Compute(const Ort::KernelContext& ctx) const {
  const NeighbourTable nbr = NeighbourTable::Read(ctx);
  for (const int64_t k : skip_taps_) {
    if (k >= nbr.taps) Fail("attribute 'skip_taps' holds ", k, ", but nbr has ", nbr.taps, " taps");
  }
  const int64_t grain = Grain(nbr.taps);
  const RowBlocks blocks{grain, BlockCount(nbr.rows, grain)};
  PairCounts counts = CountPairs(ctx, nbr, blocks);
  const TapGroups grouped = GroupTaps(counts.total, skip_taps_, groups_);
  const std::vector<Placement> placement = AllocateGroups(ctx, grouped, groups_, nbr.taps);
  PlacePairs(ctx, nbr, blocks, counts.next, placement);
  PadTaps(ctx, counts.total, placement);
}

}  // namespace sparse_lower
