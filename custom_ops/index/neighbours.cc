#include "index/neighbours.h"

#include <algorithm>
#include <iterator>
#include <type_traits>

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

void LineNeighbours(const Ort::KernelContext& ctx, const MapGeometry& geometry, const Coords& outputs,
                    const SortedSites& ascending, const IndexedInput& inputs, int64_t* nbr) {
  // Three dimensions, a grid of fewer padded in front with axes of one site, as MapGeometry walks them.
  struct Dim {
    int64_t kernel, dilation, pad, stride, extent, step;  // step: the input grid's stride
  };
  Dim dims[kMaxDims];
  const std::vector<Axis>& axes = geometry.Axes();
  const size_t skipped = kMaxDims - axes.size();
  for (size_t d = 0; d < kMaxDims; ++d) {
    dims[d] = d < skipped ? Dim{1, 1, 0, 1, 1, 0}
                          : Dim{axes[d - skipped].kernel,    axes[d - skipped].dilation,
                                axes[d - skipped].pad,       axes[d - skipped].stride,
                                axes[d - skipped].in_extent, geometry.In().stride[d - skipped]};
  }
  // Kernel lines wider than a group: each output's taps looked up one by one (a table per group would be
  // as wide as the kernel line).
  constexpr int64_t kSpan = 4096;
  if ((dims[2].kernel - 1) * dims[2].dilation > kSpan) {
    GatherNeighbours(ctx, geometry, outputs, &ascending.row, inputs, nbr);
    return;
  }
  const int64_t lines = geometry.Taps() / dims[2].kernel;
  const int64_t out_extent = axes.back().out_extent;  // the sites of one output grid line
  const int64_t in_volume = geometry.In().volume;
  // A 3³ kernel of dilation 1 on a 3D grid, the backbones' only one, with its sizes as constants: the
  // generic loop holds more values than there are registers.
  const bool cube = skipped == 0 && std::all_of(dims, dims + kMaxDims, [](const Dim& d) {
    return d.kernel == 3 && d.dilation == 1;
  });
  auto fill = [&](auto constant, int64_t begin, int64_t end) {
    constexpr bool kCube = decltype(constant)::value;
    // Every value the loop reads, as locals: the stores into nbr could otherwise alias them, and each
    // would be read again after every store.
    const Dim z = kCube ? Dim{3, 1, dims[0].pad, dims[0].stride, dims[0].extent, dims[0].step} : dims[0];
    const Dim y = kCube ? Dim{3, 1, dims[1].pad, dims[1].stride, dims[1].extent, dims[1].step} : dims[1];
    const Dim x = kCube ? Dim{3, 1, dims[2].pad, dims[2].stride, dims[2].extent, 1} : dims[2];
    const int64_t taps = z.kernel * y.kernel * x.kernel;
    const int64_t* const out_site = ascending.site.data();
    const int64_t* const out_row = ascending.row.data();
    const int64_t* const site_at = inputs.sites.site.data();
    const int64_t* const row_of = inputs.sites.row.data();
    const auto count = static_cast<int64_t>(inputs.sites.site.size());
    const int64_t window = (x.kernel - 1) * x.dilation;  // a kernel line's taps span this many sites
    // The outputs of one grid line whose first taps lie within `span` input sites, their taps on one
    // input grid line at once: that line's rows go into `near` at their x (relative to the group's first
    // tap), each output copies its kernel line's slots from there, and the entries are reset for the next.
    const int64_t span = out_extent > kSpan / x.stride ? kSpan : out_extent * x.stride;
    std::vector<int64_t> near(static_cast<size_t>(span + window), -1);
    std::vector<int64_t> cursors(static_cast<size_t>(lines), 0);  // per kernel line, where its last seek ended
    const size_t lead = kCube ? 0 : skipped;                       // the spatial columns a grid of < 3D lacks
    for (int64_t i = begin; i < end;) {
      const int64_t* const c = outputs.Row(out_row[i]);  // the batch, then D spatial coordinates
      const int64_t cz = lead > 0 ? 0 : c[1];
      const int64_t cy = lead > 1 ? 0 : c[2 - lead];
      const int64_t origin = out_site[i] - c[3 - lead];  // the output grid line's x = 0
      const int64_t group = i;
      for (; i < end && out_site[i] < origin + out_extent && (out_site[i] - out_site[group]) * x.stride < span;
           ++i) {
        if (i + kPrefetchAhead < end) PrefetchRow(outputs, nbr, taps, out_row[i + kPrefetchAhead]);
        int64_t* const row = nbr + out_row[i] * taps;
        for (int64_t k = 0; k < taps; ++k) row[k] = -1;
      }
      // The group's taps on an input line: from the first output's first to the last output's last.
      const int64_t reach = (out_site[i - 1] - out_site[group]) * x.stride + window;
      const int64_t start = (out_site[group] - origin) * x.stride - x.pad;  // the input x of near[0]
      int64_t l = 0;
      for (int64_t a = 0; a < z.kernel; ++a) {
        const int64_t iz = cz * z.stride - z.pad + a * z.dilation;
        if (iz < 0 || iz >= z.extent) {
          l += y.kernel;
          continue;
        }
        for (int64_t b = 0; b < y.kernel; ++b, ++l) {
          const int64_t iy = cy * y.stride - y.pad + b * y.dilation;
          if (iy < 0 || iy >= y.extent) continue;
          const int64_t line = c[0] * in_volume + iz * z.step + iy * y.step;  // the input grid line's x = 0
          const int64_t first = line + start;                                 // near[0]'s site
          const int64_t low = std::max(first, line);
          // The first position whose site is ≥ low: from the line's last one, by doubling steps forward
          // (a jump to the next line of the grid passes a line's sites), by a search back (a block's first).
          int64_t at = cursors[static_cast<size_t>(l)];
          if (at > 0 && site_at[at - 1] >= low) {
            at = std::lower_bound(site_at, site_at + at, low) - site_at;
          } else if (at < count && site_at[at] < low) {
            int64_t bound = 1;
            while (at + bound < count && site_at[at + bound] < low) bound *= 2;
            at = std::lower_bound(site_at + at + bound / 2 + 1, site_at + std::min(at + bound, count), low) - site_at;
          }
          const int64_t high = std::min(first + reach, line + x.extent - 1);
          int64_t stop = at;
          for (; stop < count && site_at[stop] <= high; ++stop) near[site_at[stop] - first] = row_of[stop];
          cursors[static_cast<size_t>(l)] = stop;
          if (stop == at) continue;
          for (int64_t r = group; r < i; ++r) {
            const int64_t* const from = near.data() + (out_site[r] - out_site[group]) * x.stride;
            int64_t* const to = nbr + out_row[r] * taps + l * x.kernel;
            for (int64_t k = 0; k < x.kernel; ++k) to[k] = from[k * x.dilation];
          }
          for (; at < stop; ++at) near[site_at[at] - first] = -1;
        }
      }
    }
  };
  // Blocks of at least 2048 outputs: each clears its table and starts its cursors from the first site.
  const int64_t grain = std::max<int64_t>(Grain(4 * geometry.Taps()), 2048);
  ParallelFor(ctx, outputs.rows, grain, [&](int64_t begin, int64_t end) {
    if (cube) {
      fill(std::true_type{}, begin, end);
    } else {
      fill(std::false_type{}, begin, end);
    }
  });
}

}  // namespace sparse_lower
