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
      if (ascending && i + kPrefetchAhead < end) PrefetchRow(outputs, nbr, taps, (*ascending)[i + kPrefetchAhead]);
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
  const std::vector<Axis>& axes = geometry.Axes();
  const size_t leading = axes.size() - 1;
  const Axis& last = axes.back();
  const Grid& grid = geometry.In();
  // The kernel's lines (taps that differ in the last dimension only, consecutive in the row-major tap
  // order): each line's first tap and its offset along every leading dimension.
  struct Line {
    int64_t tap;
    int64_t offset[kMaxDims];
  };
  std::vector<Line> lines(static_cast<size_t>(geometry.Taps() / last.kernel));
  for (size_t l = 0; l < lines.size(); ++l) {
    lines[l].tap = static_cast<int64_t>(l) * last.kernel;
    for (size_t d = leading, rest = l; d-- > 0; rest /= static_cast<size_t>(axes[d].kernel)) {
      lines[l].offset[d] = static_cast<int64_t>(rest % static_cast<size_t>(axes[d].kernel)) * axes[d].dilation - axes[d].pad;
    }
  }
  const int64_t taps = geometry.Taps();
  const int64_t step = last.dilation;
  const std::vector<int64_t>& site_at = inputs.sites.site;
  const std::vector<int64_t>& row_of = inputs.sites.row;
  const auto count = static_cast<int64_t>(site_at.size());
  const Coords& coords = inputs.coords;
  ParallelFor(ctx, coords.rows, Grain(4 * taps), [&](int64_t begin, int64_t end) {
    std::vector<Cursor> cursors(lines.size(), Cursor(site_at));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t m = row_of[i];
      if (i + kPrefetchAhead < end) PrefetchRow(coords, nbr, taps, row_of[i + kPrefetchAhead]);
      int64_t* row = nbr + m * taps;
      std::fill(row, row + taps, -1);
      const int64_t* c = coords.Row(m) + 1;
      // The taps of the last dimension inside the grid, the same on every line: x − p + k·d in [0, extent).
      const int64_t start = c[leading] - last.pad;
      const int64_t first_tap = start >= 0 ? 0 : (step - 1 - start) / step;
      const int64_t beyond = (last.in_extent - start + step - 1) / step;  // the first k past the grid
      const int64_t span = (std::min(last.kernel, beyond) - 1 - first_tap) * step;
      const int64_t site = site_at[i] + (first_tap * step - last.pad);
      for (size_t l = 0; l < lines.size(); ++l) {
        const Line& line = lines[l];
        int64_t first = site;
        bool inside = true;
        for (size_t d = 0; d < leading; ++d) {
          const int64_t at = c[d] + line.offset[d];
          inside &= at >= 0 && at < axes[d].in_extent;
          first += line.offset[d] * grid.stride[d];
        }
        if (!inside) continue;
        Cursor& cursor = cursors[l];
        cursor.Seek(first);
        for (int64_t at = cursor.At(); at < count && site_at[at] - first <= span; ++at) {
          const int64_t offset = site_at[at] - first;
          if (step == 1) {
            row[line.tap + first_tap + offset] = row_of[at];
          } else if (offset % step == 0) {
            row[line.tap + first_tap + offset / step] = row_of[at];
          }
        }
      }
    }
  });
}

}  // namespace sparse_lower
