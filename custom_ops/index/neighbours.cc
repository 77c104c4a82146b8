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

}  // namespace

IndexedInput ReadIndexedInput(const Ort::KernelContext& ctx, size_t index, const MapGeometry& geometry) {
  const Coords coords = ReadCoords(ctx, index, "coords", geometry.Dims());
  const std::vector<int64_t> sites = LinearSites(ctx, coords, geometry.In(), "coords", geometry.MaxBatch());
  return IndexedInput{coords, SortSites(sites, coords, "coords")};
}

std::vector<int64_t> ReachedOutputs(const Ort::KernelContext& ctx, const MapGeometry& geometry, const Coords& inputs) {
  const int64_t grain = Grain(4 * geometry.Taps());
  std::vector<std::vector<int64_t>> runs(static_cast<size_t>(BlockCount(inputs.rows, grain)));
  const int64_t volume = geometry.Out().volume;
  ParallelBlocks(ctx, static_cast<int64_t>(runs.size()), [&](int64_t block) {
    std::vector<int64_t>& run = runs[block];
    std::vector<int64_t> scratch;
    for (int64_t r = block * grain; r < std::min(inputs.rows, (block + 1) * grain); ++r) {
      const int64_t* c = inputs.Row(r);
      const int64_t base = c[0] * volume;
      geometry.ForEachOutput(c + 1, scratch, [&](int64_t, int64_t position) { run.push_back(base + position); });
    }
    std::sort(run.begin(), run.end());
    run.erase(std::unique(run.begin(), run.end()), run.end());
  });
  return SortedUnion(ctx, std::move(runs));
}

void GatherNeighbours(const Ort::KernelContext& ctx, const MapGeometry& geometry, const Coords& outputs,
                      const std::vector<int64_t>* ascending, const IndexedInput& inputs, int64_t* nbr) {
  const int64_t taps = geometry.Taps();
  const int64_t volume = geometry.In().volume;
  const bool dense = geometry.Dense();
  ParallelFor(ctx, outputs.rows, Grain(4 * taps), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> scratch;
    std::vector<Cursor> cursors(static_cast<size_t>(taps), Cursor(inputs.sites));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t m = ascending ? (*ascending)[i] : i;
      int64_t* row = nbr + m * taps;
      std::fill(row, row + taps, -1);
      const int64_t* c = outputs.Row(m);
      const int64_t base = c[0] * volume;
      geometry.ForEachInput(c + 1, scratch, [&](int64_t k, int64_t position) {
        row[k] = dense ? base + position : cursors[k].Find(base + position);
      });
    }
  });
}

}  // namespace sparse_lower
