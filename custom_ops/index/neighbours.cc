#include "index/neighbours.h"

#include <algorithm>
#include <iterator>

#include "common/parallel.h"

namespace sparse_lower {
namespace {

// The union of sorted distinct runs, merged pairwise in parallel rounds (a fixed merge tree: the
// result and its cost do not depend on the number of threads).
std::vector<int64_t> SortedUnion(const Ort::KernelContext& ctx, std::vector<std::vector<int64_t>> runs) {
  while (runs.size() > 1) {
    std::vector<std::vector<int64_t>> merged((runs.size() + 1) / 2);
    ParallelBlocks(ctx, static_cast<int64_t>(runs.size() / 2), [&](int64_t pair) {
      const auto& a = runs[2 * pair];
      const auto& b = runs[2 * pair + 1];
      merged[pair].reserve(a.size() + b.size());
      std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(merged[pair]));
    });
    if (runs.size() % 2 == 1) merged.back() = std::move(runs.back());
    runs = std::move(merged);
  }
  return runs.empty() ? std::vector<int64_t>{} : std::move(runs[0]);
}

// Rows are filled in ascending site order, which for coordinates as a user gives them (a voxelizer's
// order) is a random order of rows: each row's coordinates and its K slots of nbr then miss the cache,
// and one row at a time leaves the memory idle between misses. Asking for row i + kAhead's lines while
// row i is filled overlaps them. On the real frame as read, 1 thread: TargetMap of the UNet's finest
// inverse conv 18.4 → 13.5 ms, SubmanifoldMap 3³ 31–35 → 25–27 ms; unchanged on sorted coordinates.
// (Prefetching the mirror slots of SubmanifoldNeighbours' second pass the same way was slower.)
constexpr int64_t kAhead = 8;

void PrefetchRow(const Coords& coords, const int64_t* nbr, int64_t taps, int64_t m) {
  __builtin_prefetch(coords.Row(m));
  const int64_t* row = nbr + m * taps;
  for (int64_t k = 0; k < taps; k += 8) __builtin_prefetch(row + k, 1);  // 8 int64 per 64-byte line
  __builtin_prefetch(row + taps - 1, 1);
}

}  // namespace

IndexedInput ReadIndexedInput(const Ort::KernelContext& ctx, size_t index, const MapGeometry& geometry) {
  const Coords coords = ReadCoords(ctx, index, "coords", geometry.Dims());
  const std::vector<int64_t> sites = LinearSites(ctx, coords, geometry.In(), "coords", geometry.MaxBatch());
  return IndexedInput{coords, SortSites(sites, coords, "coords")};
}

ReachedOutputs ReachOutputs(const Ort::KernelContext& ctx, const MapGeometry& geometry, const IndexedInput& inputs) {
  const int64_t taps = geometry.Taps();
  const auto count = static_cast<int64_t>(inputs.sites.site.size());
  // Blocks of at least 4096 inputs: each holds 2·K lists, which for a large kernel would otherwise
  // cost more than the pairs they hold.
  const int64_t grain = std::max<int64_t>(Grain(4 * taps), 4096);
  const int64_t blocks = BlockCount(count, grain);
  // Per block of inputs in ascending site order, per tap: the output sites reached and the inputs' rows.
  std::vector<std::vector<std::vector<int64_t>>> block_sites(blocks), block_rows(blocks);
  const int64_t volume = geometry.Out().volume;
  ParallelBlocks(ctx, blocks, [&](int64_t block) {
    auto& sites = block_sites[block];
    auto& rows = block_rows[block];
    sites.resize(static_cast<size_t>(taps));
    rows.resize(static_cast<size_t>(taps));
    std::vector<int64_t> scratch;
    for (int64_t j = block * grain; j < std::min(count, (block + 1) * grain); ++j) {
      const int64_t row = inputs.sites.row[j];
      const int64_t* c = inputs.coords.Row(row);
      const int64_t base = c[0] * volume;
      geometry.ForEachOutput(c + 1, scratch, [&](int64_t k, int64_t position) {
        sites[k].push_back(base + position);
        rows[k].push_back(row);
      });
    }
  });
  ReachedOutputs reached;
  reached.tap_sites.resize(static_cast<size_t>(taps));
  reached.tap_rows.resize(static_cast<size_t>(taps));
  ParallelBlocks(ctx, taps, [&](int64_t k) {
    for (int64_t block = 0; block < blocks; ++block) {
      reached.tap_sites[k].insert(reached.tap_sites[k].end(), block_sites[block][k].begin(), block_sites[block][k].end());
      reached.tap_rows[k].insert(reached.tap_rows[k].end(), block_rows[block][k].begin(), block_rows[block][k].end());
    }
  });
  reached.sites = SortedUnion(ctx, reached.tap_sites);
  return reached;
}

void ScatterNeighbours(const Ort::KernelContext& ctx, const ReachedOutputs& reached, int64_t* nbr) {
  const auto taps = static_cast<int64_t>(reached.tap_sites.size());
  const auto count = static_cast<int64_t>(reached.sites.size());
  // By blocks of outputs, so that the writes of every tap stay in the block's rows of nbr (in cache).
  ParallelFor(ctx, count, Grain(4 * taps), [&](int64_t begin, int64_t end) {
    std::fill(nbr + begin * taps, nbr + end * taps, -1);
    for (int64_t k = 0; k < taps; ++k) {
      const std::vector<int64_t>& sites = reached.tap_sites[k];
      Cursor cursor(reached.sites);
      const int64_t last = reached.sites[end - 1];
      for (auto at = std::lower_bound(sites.begin(), sites.end(), reached.sites[begin]); at != sites.end() && *at <= last;
           ++at) {
        nbr[cursor.Find(*at) * taps + k] = reached.tap_rows[k][at - sites.begin()];
      }
    }
  });
}

void GatherNeighbours(const Ort::KernelContext& ctx, const MapGeometry& geometry, const Coords& outputs,
                      const std::vector<int64_t>* ascending, const IndexedInput& inputs, int64_t* nbr) {
  const int64_t taps = geometry.Taps();
  const int64_t volume = geometry.In().volume;
  const bool dense = geometry.Dense();
  ParallelFor(ctx, outputs.rows, Grain(4 * taps), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> scratch;
    std::vector<Cursor> cursors(static_cast<size_t>(taps), Cursor(inputs.sites.site));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t m = ascending ? (*ascending)[i] : i;
      if (ascending && i + kAhead < end) PrefetchRow(outputs, nbr, taps, (*ascending)[i + kAhead]);
      int64_t* row = nbr + m * taps;
      std::fill(row, row + taps, -1);
      const int64_t* c = outputs.Row(m);
      const int64_t base = c[0] * volume;
      geometry.ForEachInput(c + 1, scratch, [&](int64_t k, int64_t position) {
        if (dense) {
          row[k] = base + position;
        } else {
          const int64_t at = cursors[k].Find(base + position);
          row[k] = at < 0 ? -1 : inputs.sites.row[at];
        }
      });
    }
  });
}

void SubmanifoldNeighbours(const Ort::KernelContext& ctx, const MapGeometry& geometry, const IndexedInput& inputs,
                           int64_t* nbr) {
  const int64_t taps = geometry.Taps();
  const int64_t centre = taps / 2;  // an odd number of taps in row-major order: the centre is the middle one
  const int64_t volume = geometry.In().volume;
  const Coords& coords = inputs.coords;
  const int64_t grain = Grain(4 * taps);
  // The first half, rows in ascending site order (the cursors then ascend); every other slot -1 but the centre.
  ParallelFor(ctx, coords.rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> scratch;
    std::vector<Cursor> cursors(static_cast<size_t>(centre), Cursor(inputs.sites.site));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t m = inputs.sites.row[i];
      if (i + kAhead < end) PrefetchRow(coords, nbr, taps, inputs.sites.row[i + kAhead]);
      int64_t* row = nbr + m * taps;
      std::fill(row, row + taps, -1);
      row[centre] = m;
      const int64_t* c = coords.Row(m);
      const int64_t base = c[0] * volume;
      geometry.ForEachInput(c + 1, scratch, [&](int64_t k, int64_t position) {
        if (k < centre) {
          const int64_t at = cursors[k].Find(base + position);
          row[k] = at < 0 ? -1 : inputs.sites.row[at];
        }
      });
    }
  });
  // The mirror slots: each (j, taps−1−k) is written by the one row i with nbr[i, k] = j, and no row reads
  // the second half here, so the blocks never touch the same slot.
  ParallelFor(ctx, coords.rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      for (int64_t k = 0; k < centre; ++k) {
        const int64_t j = nbr[m * taps + k];
        if (j >= 0) nbr[j * taps + taps - 1 - k] = m;
      }
    }
  });
}

}  // namespace sparse_lower
