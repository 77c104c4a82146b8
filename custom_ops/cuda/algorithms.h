// The custom ops of the gpu target as sequences of launches over one backend: CudaBackend
// (cuda/device/cuda_backend.h: kernels on a stream, device memory) or HostBackend
// (cuda/emulated/host_backend.h: the same bodies in loops on the host). Written once, compiled for
// both, so that what CI tests on the host is what the GPU runs.
//
// Each function takes its tensors in the backend's memory and checks what docs/custom_ops.md says the
// op checks: a failing row is found on the backend (the least such row: the same one the CPU library
// names) and recorded with the values its message quotes, which the host reads when the stream's checks
// report (cuda/checks.h: at once, or at the end of a run); the message is the CPU library's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/status.h"
#include "cuda/checks.h"
#include "cuda/bodies/coalesce.h"
#include "cuda/bodies/conv.h"
#include "cuda/bodies/conv_int8.h"
#include "cuda/bodies/maps.h"
#include "cuda/bodies/movement.h"
#include "cuda/bodies/sites.h"

namespace sparse_lower {
namespace kernels {

using bodies::GridShape;
using bodies::MapShape;
using bodies::SiteTable;

// A coordinate table [rows, 1 + D] in the backend's memory.
struct CoordsView {
  const int64_t* data;
  int64_t rows;
  int64_t width;
};

// The largest batch whose linear sites in `grid` fit in int64.
inline int64_t MaxBatch(const GridShape& grid) {
  return (std::numeric_limits<int64_t>::max() - (grid.volume - 1)) / grid.volume;
}

inline std::vector<int64_t> Extents(const GridShape& grid) { return {grid.extent, grid.extent + grid.dims}; }

// Launches go in free functions: nvcc takes no extended lambda in a constructor.
template <typename B>
void Set(typename B::Stream s, int64_t* values, int64_t count, int64_t value) {
  B::ForEach(s, count, SL_LAMBDA(int64_t i) { values[i] = value; });
}

// The least row or entry a launch found, kNone when none (bodies::AtomicMin into one slot), read back at
// once: for what a size already read back refuses (CoalesceMap's members), not for input checks.
template <typename B>
class Fault {
 public:
  explicit Fault(typename B::Stream stream) : stream_(stream), slot_(stream, 1) {
    Set<B>(stream, slot_.data(), 1, bodies::kNone);
  }
  int64_t* Slot() { return slot_.data(); }
  int64_t First() {
    int64_t first = bodies::kNone;
    B::ToHost(stream_, &first, slot_.data(), sizeof first);
    return first;
  }

 private:
  typename B::Stream stream_;
  typename B::template Buffer<int64_t> slot_;
};

// Entry e of `values`, read back.
template <typename B, typename T>
T ValueAt(typename B::Stream s, const T* values, int64_t e) {
  T value{};
  B::ToHost(s, &value, values + e, sizeof value);
  return value;
}

// record->values [0, count) = from[record->at · stride …], where the record holds check `id`: what the
// message of a failed row quotes (the row of a coordinate table, one index, a scale's bits).
template <typename B, typename T>
void Quote(typename B::Stream s, bodies::FaultRecord* record, int64_t id, const T* from, int64_t stride, int64_t count) {
  B::ForEach(s, 1, SL_LAMBDA(int64_t) {
    if (!bodies::Holds(record, id)) return;
    for (int64_t i = 0; i < count; ++i) record->values[i] = bodies::Quoted(from[record->at * stride + i]);
  });
}

// Check `id` over coords: the sites of every row in `grid`, −1 and recorded for a row refused.
template <typename B>
void CheckSites(typename B::Stream s, bodies::FaultRecord* record, int64_t id, CoordsView coords, const GridShape& grid,
                int64_t max_batch, int64_t batch_size, int64_t* sites) {
  B::ForEach(s, coords.rows, SL_LAMBDA(int64_t r) {
    int64_t site = -1;
    if (bodies::CheckedSite(coords.data + r * coords.width, grid, max_batch, batch_size, &site) != bodies::kSiteOk &&
        bodies::Open(record, id)) {
      bodies::Record(record, id, r);
    }
    sites[r] = site;
  });
}

// The sites of every row of `coords` in `grid` (sites: `coords.rows` entries), each coordinate checked
// (common/coords.cc's LinearSites: batch ≥ 0, below batch_size when it is > 0, at most max_batch, and
// inside the grid).
template <typename B>
void LinearSites(typename B::Stream s, CoordsView coords, const GridShape& grid, int64_t max_batch, int64_t batch_size,
                 const char* name, const char* grid_name, int64_t* sites) {
  Checks<B>& checks = Checks<B>::Of(s);
  const int64_t width = coords.width;
  const int64_t id = checks.Open([=](const bodies::FaultRecord& f) {
    const int64_t* c = f.values;
    int64_t site = 0;
    switch (bodies::CheckedSite(c, grid, max_batch, batch_size, &site)) {
      case bodies::kNegativeBatch:
        Fail("row ", f.at, " of ", name, " has a negative batch ", c[0]);
      case bodies::kBatchNotBelowSize:
        Fail("row ", f.at, " of ", name, " has batch ", c[0], ", not below batch_size ", batch_size);
      case bodies::kBatchTooLarge:
        Fail("row ", f.at, " of ", name, " has batch ", c[0], ", too large for linear sites to fit in int64");
      default:
        Fail("coordinate ", Tuple(c, static_cast<size_t>(width)), " of row ", f.at, " of ", name, " is outside the ",
             grid_name, " ", List(Extents(grid)));
    }
  });
  CheckSites<B>(s, checks.Record(), id, coords, grid, max_batch, batch_size, sites);
  Quote<B>(s, checks.Record(), id, coords.data, width, width);
  checks.Settle(s);
}

// Inserts every row r of `sites` into `table`; check `id` records the least row that repeats an earlier
// row's site.
template <typename B>
void InsertRows(typename B::Stream s, SiteTable table, const int64_t* sites, int64_t rows, bodies::FaultRecord* record,
                int64_t id) {
  Set<B>(s, table.keys, table.mask + 1, -1);
  Set<B>(s, table.rows, table.mask + 1, bodies::kNone);
  B::ForEach(s, rows, SL_LAMBDA(int64_t r) { bodies::Insert(table, sites[r], r); });
  B::ForEach(s, rows, SL_LAMBDA(int64_t r) {
    if (bodies::Find(table, sites[r]) != r && bodies::Open(record, id)) bodies::Record(record, id, r);
  });
}

// record->values[slot] = the least row whose site is the recorded row's, where the record holds check
// `id`: the earlier of two equal rows.
template <typename B>
void QuoteEarliest(typename B::Stream s, bodies::FaultRecord* record, int64_t id, const int64_t* sites, int64_t rows,
                   int slot) {
  B::ForEach(s, 1, SL_LAMBDA(int64_t) {
    if (bodies::Holds(record, id)) record->values[slot] = record->at;
  });
  B::ForEach(s, rows, SL_LAMBDA(int64_t r) {
    if (bodies::Holds(record, id) && sites[r] == sites[record->at]) bodies::AtomicMin(record->values + slot, r);
  });
}

// A site table of the rows of `coords` (their `sites`), refusing two equal rows as the CPU library does:
// naming the least row that repeats an earlier one, and that one.
template <typename B>
class IndexedSites {
 public:
  IndexedSites(typename B::Stream s, CoordsView coords, const int64_t* sites, const char* name)
      : capacity_(bodies::TableCapacity(coords.rows)), keys_(s, capacity_), rows_(s, capacity_) {
    Checks<B>& checks = Checks<B>::Of(s);
    const int64_t width = coords.width;
    const int64_t id = checks.Open([=](const bodies::FaultRecord& f) {
      Fail("rows ", f.values[width], " and ", f.at, " of ", name, " are the same coordinate ",
           Tuple(f.values, static_cast<size_t>(width)));
    });
    InsertRows<B>(s, Table(), sites, coords.rows, checks.Record(), id);
    Quote<B>(s, checks.Record(), id, coords.data, width, width);
    QuoteEarliest<B>(s, checks.Record(), id, sites, coords.rows, static_cast<int>(width));
    checks.Settle(s);
  }

  SiteTable Table() { return SiteTable{keys_.data(), rows_.data(), capacity_ - 1}; }

 private:
  int64_t capacity_;
  typename B::template Buffer<int64_t> keys_;
  typename B::template Buffer<int64_t> rows_;
};

// The input coordinates of a map builder, checked (in the input grid, batch ≥ 0, no duplicates) and
// in a site table (index/neighbours.h's ReadIndexedInput).
template <typename B>
class MapInput {
 public:
  MapInput(typename B::Stream s, const MapShape& map, CoordsView coords)
      : coords_(coords), sites_(s, coords.rows), indexed_(s, coords, Sites(s, map, coords, sites_.data()), "coords") {}

  CoordsView Coords() const { return coords_; }
  SiteTable Table() { return indexed_.Table(); }

  // The largest batch whose sites fit in int64 in both grids of the map.
  static int64_t MapMaxBatch(const MapShape& map) {
    return std::min(MaxBatch(bodies::InGrid(map)), MaxBatch(bodies::OutGrid(map)));
  }

 private:
  static const int64_t* Sites(typename B::Stream s, const MapShape& map, CoordsView coords, int64_t* sites) {
    LinearSites<B>(s, coords, bodies::InGrid(map), MapMaxBatch(map), 0, "coords", "grid", sites);
    return sites;
  }

  CoordsView coords_;
  typename B::template Buffer<int64_t> sites_;
  IndexedSites<B> indexed_;
};

// nbr [outputs.rows, K] of the outputs at `outputs` (checked already): the row each tap reads (its
// linear site for a dense source), or −1.
template <typename B>
void Neighbours(typename B::Stream s, const MapShape& map, CoordsView outputs, SiteTable inputs, bool dense,
                int64_t* nbr) {
  const int64_t taps = bodies::Taps(map);
  const GridShape in = bodies::InGrid(map);
  B::ForEach(s, outputs.rows * taps, SL_LAMBDA(int64_t i) {
    const int64_t m = i / taps;
    nbr[i] = bodies::Neighbour(map, in, outputs.data + m * outputs.width, i % taps, dense, inputs);
  });
}

// SubmanifoldMap: nbr [N, K] of the input rows themselves.
template <typename B>
void SubmanifoldMap(typename B::Stream s, const MapShape& map, CoordsView coords, bool dense, int64_t* nbr) {
  MapInput<B> input(s, map, coords);
  Neighbours<B>(s, map, coords, input.Table(), dense, nbr);
}

// sites [rows, K]: the output site each row reaches through each tap, or −1.
template <typename B>
int64_t* OutputSites(typename B::Stream s, const MapShape& map, CoordsView coords, int64_t* sites) {
  const int64_t taps = bodies::Taps(map);
  const GridShape out = bodies::OutGrid(map);
  B::ForEach(s, coords.rows * taps, SL_LAMBDA(int64_t i) {
    sites[i] = bodies::TapSite(map, out, coords.data + (i / taps) * coords.width, i % taps, /*to_input=*/false);
  });
  return sites;
}

// The outputs of StridedMap and TransposedMap: every output site some input reaches through some tap,
// ascending and distinct. Built in two steps, because the caller allocates the outputs in between.
template <typename B>
class ReachedSites {
 public:
  ReachedSites(typename B::Stream s, const MapShape& map, CoordsView coords)
      : map_(map), input_(s, map, coords), sites_(s, coords.rows * bodies::Taps(map)) {
    const int64_t distinct = B::SortUnique(s, OutputSites<B>(s, map, coords, sites_.data()), coords.rows * bodies::Taps(map));
    int64_t least = 0;  // −1 (a tap leaving the grid) sorts first
    if (distinct > 0) B::ToHost(s, &least, sites_.data(), sizeof least);
    first_ = least < 0 ? 1 : 0;
    count_ = distinct - first_;
  }

  int64_t Count() const { return count_; }

  // out_coords [Count(), 1 + D] and nbr [Count(), K], in the backend's memory.
  void Write(typename B::Stream s, bool dense, int64_t* out_coords, int64_t* nbr) {
    const GridShape out = bodies::OutGrid(map_);
    const int64_t width = 1 + map_.dims;
    const int64_t* sites = sites_.data() + first_;
    B::ForEach(s, count_, SL_LAMBDA(int64_t m) { bodies::DecodeSite(sites[m], out, out_coords + m * width); });
    Neighbours<B>(s, map_, CoordsView{out_coords, count_, width}, input_.Table(), dense, nbr);
  }

 private:
  MapShape map_;
  MapInput<B> input_;
  typename B::template Buffer<int64_t> sites_;
  int64_t first_ = 0, count_ = 0;
};

// TargetMap: nbr [M, K] of the given output coordinates (checked in the output grid, no duplicates).
template <typename B>
void TargetMap(typename B::Stream s, const MapShape& map, CoordsView coords, CoordsView targets, bool dense,
               int64_t* nbr) {
  MapInput<B> input(s, map, coords);
  typename B::template Buffer<int64_t> sites(s, targets.rows);
  LinearSites<B>(s, targets, bodies::OutGrid(map), MapInput<B>::MapMaxBatch(map), 0, "target_coords", "output grid",
                 sites.data());
  IndexedSites<B> distinct(s, targets, sites.data(), "target_coords");
  Neighbours<B>(s, map, targets, input.Table(), dense, nbr);
}

// SiteIndex: the linear sites of coordinates in a dense [batch_size, C, *grid] tensor, checked.
template <typename B>
void SiteIndex(typename B::Stream s, const GridShape& grid, int64_t batch_size, CoordsView coords, int64_t* sites) {
  LinearSites<B>(s, coords, grid, MaxBatch(grid), batch_size, "coords", "grid", sites);
  IndexedSites<B> distinct(s, coords, sites, "coords");
}

// flags [sites]: whether any channel of each site of a dense X [B, channels, volume] is non-zero (NaN counts).
template <typename B>
const uint8_t* Marked(typename B::Stream s, const float* x, int64_t sites, int64_t channels, int64_t volume,
                      uint8_t* flags) {
  B::ForEach(s, sites, SL_LAMBDA(int64_t site) {
    const float* values = x + (site / volume) * channels * volume + site % volume;
    uint8_t any = 0;
    for (int64_t c = 0; c < channels; ++c) any |= values[c * volume] != 0.0f;
    flags[site] = any;
  });
  return flags;
}

// ActiveSites: the sites of a dense X [batch, channels, *grid] where any channel is non-zero (NaN
// counts), ascending. Two steps: count, then write coords [Count(), 1 + D] and sites [Count()].
template <typename B>
class ActiveSites {
 public:
  ActiveSites(typename B::Stream s, const float* x, int64_t batch, int64_t channels, const GridShape& grid)
      : grid_(grid), found_(s, batch * grid.volume) {
    const int64_t total = channels > 0 ? batch * grid.volume : 0;
    typename B::template Buffer<uint8_t> active(s, total);
    count_ = B::Select(s, Marked<B>(s, x, total, channels, grid.volume, active.data()), total, found_.data());
  }

  int64_t Count() const { return count_; }

  void Write(typename B::Stream s, int64_t* coords, int64_t* sites) {
    const GridShape grid = grid_;
    const int64_t* found = found_.data();
    const int64_t width = 1 + grid.dims;
    B::ForEach(s, count_, SL_LAMBDA(int64_t n) {
      sites[n] = found[n];
      bodies::DecodeSite(found[n], grid, coords + n * width);
    });
  }

 private:
  GridShape grid_;
  typename B::template Buffer<int64_t> found_;
  int64_t count_ = 0;
};

// values[i] = i for i < count.
template <typename B>
int64_t* Iota(typename B::Stream s, int64_t* values, int64_t count) {
  B::ForEach(s, count, SL_LAMBDA(int64_t i) { values[i] = i; });
  return values;
}

// SiteOrder: out_coords [rows, 1 + D], the rows of coords by ascending site; order [rows], the row each
// is; rank [rows], the place of each row in that order. Each coordinate checked, no two rows equal.
template <typename B>
void SiteOrder(typename B::Stream s, const GridShape& grid, CoordsView coords, int64_t* out_coords, int64_t* order,
               int64_t* rank) {
  const int64_t rows = coords.rows, width = coords.width;
  typename B::template Buffer<int64_t> sites(s, rows);
  LinearSites<B>(s, coords, grid, MaxBatch(grid), 0, "coords", "grid", sites.data());
  { IndexedSites<B> distinct(s, coords, sites.data(), "coords"); }
  B::StableSortByKey(s, sites.data(), Iota<B>(s, order, rows), rows);
  const int64_t* sorted = sites.data();
  B::ForEach(s, rows, SL_LAMBDA(int64_t i) {
    bodies::DecodeSite(sorted[i], grid, out_coords + i * width);
    rank[order[i]] = i;
  });
}

// flags [rows]: whether each position of the sorted sites starts a group (CoalesceMap).
template <typename B>
const uint8_t* GroupStarts(typename B::Stream s, const int64_t* sorted, int64_t rows, uint8_t* flags) {
  B::ForEach(s, rows, SL_LAMBDA(int64_t i) { flags[i] = bodies::StartsGroup(sorted, i); });
  return flags;
}

// The most rows any of the `groups` groups starting at `starts` has, at least 1.
template <typename B>
int64_t Fullest(typename B::Stream s, const int64_t* starts, int64_t groups, int64_t rows) {
  typename B::template Buffer<int64_t> most(s, 1);
  int64_t* slot = most.data();
  Set<B>(s, slot, 1, 1);
  B::ForEach(s, groups, SL_LAMBDA(int64_t g) {
    bodies::AtomicMax(slot, bodies::GroupEnd(starts, groups, rows, g) - starts[g]);
  });
  int64_t fullest = 1;
  B::ToHost(s, &fullest, slot, sizeof fullest);
  return fullest;
}

// The first group (in site order) with more than `members` rows.
template <typename B>
int64_t FirstOverfull(typename B::Stream s, const int64_t* starts, int64_t groups, int64_t rows, int64_t members) {
  Fault<B> fault(s);
  int64_t* first = fault.Slot();
  B::ForEach(s, groups, SL_LAMBDA(int64_t g) {
    if (bodies::GroupEnd(starts, groups, rows, g) - starts[g] > members) bodies::AtomicMin(first, g);
  });
  return fault.First();
}

// CoalesceMap: the distinct sites of coords (rows may repeat a site; each coordinate checked), sorted,
// and the rows at each site in input order, in a table of R columns: the most rows a site has (at
// least 1), or `members` when it is > 0, a site with more rows being refused as the CPU library does.
// Two steps, as ReachedSites: the counts (read back, for the caller to allocate), then the writes.
template <typename B>
class CoalescedSites {
 public:
  CoalescedSites(typename B::Stream s, const GridShape& grid, CoordsView coords, int64_t members)
      : grid_(grid), rows_(coords.rows), sites_(s, rows_), order_(s, rows_), starts_(s, rows_) {
    LinearSites<B>(s, coords, grid, MaxBatch(grid), 0, "coords", "grid", sites_.data());
    B::StableSortByKey(s, sites_.data(), Iota<B>(s, order_.data(), rows_), rows_);
    {
      typename B::template Buffer<uint8_t> flags(s, rows_);
      count_ = B::Select(s, GroupStarts<B>(s, sites_.data(), rows_, flags.data()), rows_, starts_.data());
    }
    const int64_t fullest = Fullest<B>(s, starts_.data(), count_, rows_);
    if (members > 0 && fullest > members) {
      Checks<B>::Of(s).Report(s);  // an earlier op's fault first, as the CPU library would fail there
      const int64_t g = FirstOverfull<B>(s, starts_.data(), count_, rows_, members);
      const int64_t begin = ValueAt<B>(s, starts_.data(), g);
      const int64_t end = g + 1 < count_ ? ValueAt<B>(s, starts_.data(), g + 1) : rows_;
      Fail("coords hold ", end - begin, " rows at the site of row ", ValueAt<B>(s, order_.data(), begin),
           ", more than members = ", members, " (max_members); raise max_members to at least ", fullest);
    }
    width_ = members > 0 ? members : fullest;
  }

  int64_t Count() const { return count_; }
  int64_t Width() const { return width_; }

  // out_coords [Count(), 1 + D] and members [Count(), Width()], in the backend's memory.
  void Write(typename B::Stream s, int64_t* out_coords, int64_t* table) {
    const GridShape grid = grid_;
    const int64_t* sites = sites_.data();
    const int64_t* order = order_.data();
    const int64_t* starts = starts_.data();
    const int64_t groups = count_, rows = rows_, width = width_, coords_width = 1 + grid.dims;
    B::ForEach(s, groups, SL_LAMBDA(int64_t g) {
      bodies::DecodeSite(sites[starts[g]], grid, out_coords + g * coords_width);
    });
    B::ForEach(s, groups * width, SL_LAMBDA(int64_t i) {
      table[i] = bodies::Member(order, starts, groups, rows, i / width, i % width);
    });
  }

 private:
  GridShape grid_;
  int64_t rows_;
  typename B::template Buffer<int64_t> sites_;
  typename B::template Buffer<int64_t> order_;
  typename B::template Buffer<int64_t> starts_;
  int64_t count_ = 0, width_ = 1;
};

// Check `id` over values [count]: records the least entry `valid` refuses.
template <typename B, typename T, typename Valid>
void RecordRefused(typename B::Stream s, bodies::FaultRecord* record, int64_t id, const T* values, int64_t count,
                   Valid valid) {
  B::ForEach(s, count, SL_LAMBDA(int64_t e) {
    if (!valid(values[e]) && bodies::Open(record, id)) bodies::Record(record, id, e);
  });
}

// Checks every entry of values [count] with `valid`; `message` words the least one refused, whose value
// is the record's values[0].
template <typename B, typename T, typename Valid>
void CheckEntries(typename B::Stream s, const T* values, int64_t count, Valid valid,
                  typename Checks<B>::Message message) {
  Checks<B>& checks = Checks<B>::Of(s);
  const int64_t id = checks.Open(std::move(message));
  RecordRefused<B>(s, checks.Record(), id, values, count, valid);
  Quote<B>(s, checks.Record(), id, values, 1, 1);
  checks.Settle(s);
}

// An index of one of `limit` rows or sites, or −1.
struct IndexBelow {
  int64_t limit;
  SL_HD bool operator()(int64_t v) const { return bodies::ValidIndex(v, limit); }
};

// Refuses an idx [rows, taps] entry outside [−1, limit), as the CPU library's tap lists and unfold do.
template <typename B>
void CheckTapIndices(typename B::Stream s, const int64_t* idx, int64_t rows, int64_t taps, int64_t limit,
                     const char* what) {
  CheckEntries<B>(s, idx, rows * taps, IndexBelow{limit}, [=](const bodies::FaultRecord& f) {
    Fail("idx value ", f.values[0], " (row ", f.at / taps, ", tap ", f.at % taps, ") is outside [0, ", limit, "), the ",
         what, " of X; only -1 marks a missing input");
  });
}

// IndexedUnfold: y [rows, taps, channels] from X rows [limit, channels] or a dense X of `volume` sites
// per batch (limit = its sites).
template <typename B>
void Unfold(typename B::Stream s, const float* x, int64_t limit, int64_t channels, bool dense, int64_t volume,
            const int64_t* idx, int64_t rows, int64_t taps, float* y) {
  CheckTapIndices<B>(s, idx, rows, taps, limit, dense ? "sites" : "rows");
  B::ForEach(s, rows * taps * channels, SL_LAMBDA(int64_t i) {
    y[i] = bodies::UnfoldValue(x, limit, idx[i / channels], i % channels, channels, volume, dense);
  });
}

// IndexedFold: y (rows [targets, channels], or dense [B, channels, *grid] of `volume` sites per batch) from
// zeros, or from `init` (rows only: [targets, channels] when init_rows, else [channels] on every row),
// plus rows[p] at idx[p] (count entries, −1 skipped) in ascending p.
template <typename B>
void Fold(typename B::Stream s, const float* rows, const int64_t* idx, int64_t count, int64_t channels,
          int64_t targets, bool dense, int64_t volume, const float* init, bool init_rows, float* y) {
  CheckEntries<B>(s, idx, count, IndexBelow{targets}, [=](const bodies::FaultRecord& f) {
    Fail("idx value ", f.values[0], " (entry ", f.at, ") is outside [0, ", targets,
         "), the rows or sites of Y; only -1 skips");
  });
  typename B::template Buffer<int64_t> keys(s, count), entries(s, count);
  int64_t* key = keys.data();
  int64_t* entry = entries.data();
  B::ForEach(s, count, SL_LAMBDA(int64_t p) {
    key[p] = idx[p];
    entry[p] = p;
  });
  B::StableSortByKey(s, key, entry, count);
  B::ForEach(s, targets * channels, SL_LAMBDA(int64_t i) {
    const int64_t t = i / channels, c = i % channels;
    const int64_t begin = bodies::LowerBound(key, count, t), end = bodies::LowerBound(key, count, t + 1);
    const float start = init == nullptr ? 0.0f : init[init_rows ? i : c];
    y[bodies::ChannelOffset(t, c, channels, volume, dense)] = bodies::FoldValue(start, rows, entry, begin, end, c, channels);
  });
}

constexpr int64_t kBlocksPerMultiprocessor = 4;  // what a split aims for: a few tiles resident on each
constexpr int32_t kMostSplits = 8;

// How many blocks share each tile's taps: enough for kBlocksPerMultiprocessor blocks on each of the GPU's
// multiprocessors, at most kMostSplits and the taps; 1 where the tiles alone are that many.
inline int32_t TapSplits(const bodies::ConvArgs& a, int multiprocessors) {
  const int cols = bodies::TileColumns(a.cout);
  const int64_t tiles = ((a.rows + bodies::kTileRows - 1) / bodies::kTileRows) * ((a.cout + cols - 1) / cols);
  if (tiles == 0) return 1;
  const int64_t wanted = (kBlocksPerMultiprocessor * multiprocessors + tiles - 1) / tiles;
  return static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>({wanted, kMostSplits, a.taps})));
}

// IndexedConv, its products in float32 or on tensor cores in float16 or bfloat16 (summed in float32), its
// taps split across `splits` blocks per tile (0: as TapSplits chooses for this GPU).
template <typename B>
void Conv(typename B::Stream s, bodies::ConvArgs args, bodies::Products products, int32_t splits = 0) {
  CheckTapIndices<B>(s, args.idx, args.rows, args.taps, args.inputs, "rows");
  args.splits = splits > 0 ? std::max<int32_t>(1, static_cast<int32_t>(std::min<int64_t>(splits, args.taps)))
                           : TapSplits(args, B::Multiprocessors(s));
  args.split_taps = (args.taps + args.splits - 1) / args.splits;
  typename B::template Buffer<float> partial(s, args.splits > 1 ? args.splits * args.rows * args.cout : 0);
  args.partial = partial.data();
  if (products == bodies::Products::kFloat32) {
    B::ConvFloat(s, args);
  } else {
    B::ConvHalf(s, args, products);
  }
  if (args.splits > 1) {
    const bodies::ConvArgs a = args;
    B::ForEach(s, a.rows * a.cout, SL_LAMBDA(int64_t i) { bodies::AddSplits(a, i / a.cout, i % a.cout); });
  }
}

struct ValidScale {
  SL_HD bool operator()(float v) const { return bodies::ValidScale(v); }
};
struct ValidWeight {
  int most;  // bodies::MaxWeight(cin)
  SL_HD bool operator()(int8_t v) const { return bodies::ValidWeight(v, most); }
};

template <typename B>
void CheckScales(typename B::Stream s, const float* scales, int64_t count, const char* name) {
  CheckEntries<B>(s, scales, count, ValidScale{}, [=](const bodies::FaultRecord& f) {
    Fail(name, " must be finite and positive, got ", bodies::BitsFloat(f.values[0]), " at flat index ", f.at);
  });
}

// X's codes [inputs, cin] (conv/indexed_conv_int8.cc's QuantizeRow).
template <typename B>
const uint8_t* Codes(typename B::Stream s, const float* x, int64_t inputs, int64_t cin, const float* x_scale,
                     float* inverse, uint8_t* q) {
  B::ForEach(s, cin, SL_LAMBDA(int64_t c) { inverse[c] = 1.0f / x_scale[c]; });
  B::ForEach(s, inputs * cin, SL_LAMBDA(int64_t i) { q[i] = bodies::Code(x[i], inverse[i % cin]); });
  return q;
}

// 128 · Σ_c W[k, c, o] for every (k, o).
template <typename B>
const int32_t* Centres(typename B::Stream s, const int8_t* w, int64_t taps, int64_t cin, int64_t cout, int32_t* centre) {
  B::ForEach(s, taps * cout, SL_LAMBDA(int64_t i) { centre[i] = bodies::CentreOf(w, cin, cout, i / cout, i % cout); });
  return centre;
}

// IndexedConvInt8: args.x and the weights w (int8 [taps, cin, cout]) with x_scale [cin] and w_scale
// [taps, cout], checked as the CPU library checks them and in its order; the same bits as its result.
template <typename B>
void ConvInt8(typename B::Stream s, const bodies::ConvArgs& args, const int8_t* w, const float* x_scale,
              const float* w_scale) {
  if (args.cin > bodies::kMaxInt8Channels) {
    Checks<B>::Of(s).Report(s);  // an earlier op's fault first, as the CPU library would fail there
    Fail("Cin = ", args.cin, " is above the ", bodies::kMaxInt8Channels, " input channels this op sums exactly");
  }
  CheckScales<B>(s, x_scale, args.cin, "x_scale");
  CheckScales<B>(s, w_scale, args.taps * args.cout, "w_scale");
  const int most = bodies::MaxWeight(args.cin);
  CheckEntries<B>(s, w, args.taps * args.cin * args.cout, ValidWeight{most},
                  [most, cin = args.cin](const bodies::FaultRecord& f) {
                    Fail("W must be within [-", most, ", ", most, "] with Cin = ", cin, " (see IndexedConvInt8), got ",
                         f.values[0], " at flat index ", f.at, "; quantize with sparse_lower.quantize");
                  });
  CheckTapIndices<B>(s, args.idx, args.rows, args.taps, args.inputs, "rows");
  typename B::template Buffer<float> inverse(s, args.cin);
  typename B::template Buffer<uint8_t> q(s, args.inputs * args.cin);
  typename B::template Buffer<int32_t> centre(s, args.taps * args.cout);
  const bodies::Int8ConvArgs int8{args, Codes<B>(s, args.x, args.inputs, args.cin, x_scale, inverse.data(), q.data()),
                                  w, Centres<B>(s, w, args.taps, args.cin, args.cout, centre.data()), w_scale};
  B::ConvInt8(s, int8);
}

}  // namespace kernels
}  // namespace sparse_lower
