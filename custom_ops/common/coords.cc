#include "common/coords.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "common/attributes.h"
#include "common/parallel.h"
#include "common/status.h"
#include "common/tensor.h"

namespace sparse_lower {
namespace {

// Sorts the (site, row) pairs by site, equal sites in their order (rows ascending, as they start): a
// stable LSD radix sort over the bits the largest site uses, in the fewest passes of at most 14 bits.
// Sites are ≥ 0 (LinearSites checks). Why not std::sort: 2 sequential passes on the real frames against
// log N compares through an index (StridedMap on the CenterPoint frame as read, 1 thread: 29.7 → 25.1 ms,
// in 3 passes of 11 bits; 2 of 14 took SiteOrder on that frame from 1.07 to 0.93 ms).
void RadixSort(SortedSites& sorted) {
  constexpr int kMaxBits = 14;  // a histogram of 2^14 counts: 128 KiB, in L2
  const size_t n = sorted.site.size();
  std::vector<int64_t> site(n);
  std::vector<int64_t> row(n);
  const int64_t largest = *std::max_element(sorted.site.begin(), sorted.site.end());
  const int used = 64 - __builtin_clzll(static_cast<uint64_t>(largest) | 1);
  const int passes = (used + kMaxBits - 1) / kMaxBits;
  const int bits = (used + passes - 1) / passes;
  const int64_t mask = (int64_t{1} << bits) - 1;
  for (int shift = 0; shift < used; shift += bits) {
    std::vector<size_t> start(static_cast<size_t>(mask + 2), 0);
    for (const int64_t s : sorted.site) ++start[static_cast<size_t>(((s >> shift) & mask) + 1)];
    std::partial_sum(start.begin(), start.end(), start.begin());
    for (size_t i = 0; i < n; ++i) {
      const size_t at = start[static_cast<size_t>((sorted.site[i] >> shift) & mask)]++;
      site[at] = sorted.site[i];
      row[at] = sorted.row[i];
    }
    sorted.site.swap(site);
    sorted.row.swap(row);
  }
}

}  // namespace

Grid::Grid(std::vector<int64_t> extent_, std::string name_) : extent(std::move(extent_)), name(std::move(name_)) {
  stride.assign(extent.size(), 1);
  for (size_t d = extent.size(); d-- > 0;) {
    if (extent[d] < 1) Fail("the ", name, " ", List(extent), " has an extent below 1");
    stride[d] = volume;
    if (__builtin_mul_overflow(volume, extent[d], &volume)) {
      Fail("the ", name, " ", List(extent), " has more sites than int64 can number");
    }
  }
  max_batch = (std::numeric_limits<int64_t>::max() - (volume - 1)) / volume;
}

void Grid::Decode(int64_t site, int64_t* coord) const {
  coord[0] = site / volume;
  int64_t position = site % volume;
  for (size_t d = 0; d < extent.size(); ++d) {
    coord[1 + d] = position / stride[d];
    position %= stride[d];
  }
}

std::optional<Grid> SpatialShape(const Ort::ConstKernelInfo& info) {
  std::optional<std::vector<int64_t>> extent = IntsAttribute(info, "spatial_shape");
  if (!extent) return std::nullopt;
  if (extent->empty() || extent->size() > kMaxDims) {
    Fail("attribute 'spatial_shape' = ", List(*extent), " needs 1, 2 or 3 dimensions");
  }
  return Grid(*std::move(extent), "grid");
}

void CheckCoordsPairing(const Ort::KernelContext& ctx, size_t index, int64_t rows) {
  if (!HasInput(ctx, index)) return;
  const std::vector<int64_t> coords = InputShape(ctx, index);
  if (coords.size() != 2) Fail("coords must have shape [N, 1 + D], got ", List(coords));
  if (coords[0] != rows) {
    Fail("X has ", rows, " rows but coords has ", coords[0], ": features and coords must pair row by row");
  }
}

Coords ReadCoords(const Ort::KernelContext& ctx, size_t index, const char* name, size_t dims) {
  const Input<int64_t> input = ReadInput<int64_t>(ctx, index);
  const auto width = static_cast<int64_t>(1 + dims);
  if (input.Rank() != 2 || input.shape[1] != width) {
    Fail(name, " must have shape [N, ", width, "] (batch and ", dims, " spatial columns), got ", List(input.shape));
  }
  return Coords{input.data, input.shape[0], width};
}

std::vector<int64_t> LinearSites(const Ort::KernelContext& ctx, const Coords& coords, const Grid& grid,
                                 const char* name, int64_t max_batch, int64_t batch_size) {
  std::vector<int64_t> sites(static_cast<size_t>(coords.rows));
  const size_t dims = grid.Dims();
  ParallelFor(ctx, coords.rows, Grain(coords.width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t* c = coords.Row(r);
      if (c[0] < 0) Fail("row ", r, " of ", name, " has a negative batch ", c[0]);
      if (batch_size > 0 && c[0] >= batch_size) {
        Fail("row ", r, " of ", name, " has batch ", c[0], ", not below batch_size ", batch_size);
      }
      if (c[0] > max_batch) {
        Fail("row ", r, " of ", name, " has batch ", c[0], ", too large for linear sites to fit in int64");
      }
      int64_t position = 0;
      for (size_t d = 0; d < dims; ++d) {
        if (c[1 + d] < 0 || c[1 + d] >= grid.extent[d]) {
          Fail("coordinate ", Tuple(c, coords.width), " of row ", r, " of ", name, " is outside the ", grid.name, " ",
               List(grid.extent));
        }
        position += c[1 + d] * grid.stride[d];
      }
      sites[r] = c[0] * grid.volume + position;
    }
  });
  return sites;
}

SortedSites SortSites(const std::vector<int64_t>& sites, const Coords& coords, const char* name) {
  SortedSites sorted;
  sorted.site = sites;
  sorted.row.resize(sites.size());
  std::iota(sorted.row.begin(), sorted.row.end(), int64_t{0});
  if (std::adjacent_find(sites.begin(), sites.end(), std::greater_equal<>()) == sites.end()) return sorted;

  RadixSort(sorted);
  // Of all equal pairs, the one a scan in row order meets first: the least second row of a run.
  int64_t first = -1;
  int64_t repeat = coords.rows;
  for (size_t i = 0; i < sorted.row.size(); ++i) {
    if (i > 0 && sorted.site[i] == sorted.site[i - 1] && (i < 2 || sorted.site[i - 2] != sorted.site[i]) &&
        sorted.row[i] < repeat) {
      first = sorted.row[i - 1];
      repeat = sorted.row[i];
    }
  }
  if (first >= 0) {
    Fail("rows ", first, " and ", repeat, " of ", name, " are the same coordinate ", Tuple(coords.Row(repeat), coords.width));
  }
  return sorted;
}

void WriteCoords(const Ort::KernelContext& ctx, const std::vector<int64_t>& sites, const Grid& grid, int64_t* out) {
  const auto width = static_cast<int64_t>(1 + grid.Dims());
  ParallelFor(ctx, static_cast<int64_t>(sites.size()), Grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) grid.Decode(sites[m], out + m * width);
  });
}

}  // namespace sparse_lower
