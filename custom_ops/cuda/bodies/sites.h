// Linear sites and the table that finds a site's row: the bodies every index builder of the CUDA
// library runs per coordinate (docs/custom_ops.md: the linear site of (b, d0, d1, d2) is
// b·V + (d0·S1 + d1)·S2 + d2).
//
// The CPU library finds sites in a sorted list with a cursor per tap; a GPU thread per (row, tap) has
// no order to follow, so here the sites go into an open-addressing hash table (as spconv's and
// libspconv's GPU builders do): a key per slot, linear probing, one compare-and-swap per insert.
#pragma once

#include <cstdint>

#include "cuda/hd.h"

namespace sparse_lower {
namespace bodies {

constexpr int kMaxDims = 3;
constexpr int64_t kNone = INT64_MAX;  // "no failing row" in a fault record

// A grid of one batch: its extents, row-major strides and volume. Plain data, copied to the device by value.
struct GridShape {
  int32_t dims;
  int64_t extent[kMaxDims];
  int64_t stride[kMaxDims];
  int64_t volume;
};

// The grid of `dims` extents (each ≥ 1; the caller has checked that the volume fits in int64).
SL_HD inline GridShape MakeGrid(int dims, const int64_t* extent) {
  GridShape grid{};
  grid.dims = dims;
  grid.volume = 1;
  for (int d = dims; d-- > 0;) {
    grid.extent[d] = extent[d];
    grid.stride[d] = grid.volume;
    grid.volume *= extent[d];
  }
  return grid;
}

// What is wrong with a coordinate, in the order the CPU library checks (common/coords.cc).
enum SiteCheck : int32_t { kSiteOk = 0, kNegativeBatch, kBatchNotBelowSize, kBatchTooLarge, kOutsideGrid };

// The linear site of coordinate c = (batch, d0, ...) in `grid`, or why it has none: a negative batch,
// a batch not below batch_size (when batch_size > 0), a batch above max_batch, or a spatial coordinate
// outside the grid.
SL_HD inline SiteCheck CheckedSite(const int64_t* c, const GridShape& grid, int64_t max_batch, int64_t batch_size,
                                   int64_t* site) {
  if (c[0] < 0) return kNegativeBatch;
  if (batch_size > 0 && c[0] >= batch_size) return kBatchNotBelowSize;
  if (c[0] > max_batch) return kBatchTooLarge;
  int64_t position = 0;
  for (int d = 0; d < grid.dims; ++d) {
    if (c[1 + d] < 0 || c[1 + d] >= grid.extent[d]) return kOutsideGrid;
    position += c[1 + d] * grid.stride[d];
  }
  *site = c[0] * grid.volume + position;
  return kSiteOk;
}

// Writes (batch, d0, ...) of a linear site.
SL_HD inline void DecodeSite(int64_t site, const GridShape& grid, int64_t* c) {
  c[0] = site / grid.volume;
  int64_t position = site % grid.volume;
  for (int d = 0; d < grid.dims; ++d) {
    c[1 + d] = position / grid.stride[d];
    position %= grid.stride[d];
  }
}

// Sites (≥ 0) to rows. keys[s] = −1 marks an empty slot; rows[s] starts at kNone and keeps the least
// row inserted with the slot's key, so that the table holds the first of two equal rows whatever order
// the threads insert in (a second row with the same site is then told by its row not being the one
// found: a duplicated coordinate, which the builders refuse).
struct SiteTable {
  int64_t* keys;
  int64_t* rows;
  int64_t mask;  // capacity − 1, the capacity a power of two
};

// Slots for n sites: the least power of two ≥ 2n (at most half full, so a probe ends in a few steps).
SL_HD inline int64_t TableCapacity(int64_t n) {
  int64_t capacity = 2;
  while (capacity < 2 * n) capacity *= 2;
  return capacity;
}

SL_HD inline int64_t FirstSlot(int64_t site, int64_t mask) {
  uint64_t h = static_cast<uint64_t>(site) + 0x9e3779b97f4a7c15ull;  // splitmix64's finaliser
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return static_cast<int64_t>((h ^ (h >> 31)) & static_cast<uint64_t>(mask));
}

// A negative site (a row whose coordinate was refused, in a stream that reports later) is left out.
SL_HD inline void Insert(const SiteTable& table, int64_t site, int64_t row) {
  if (site < 0) return;
  for (int64_t slot = FirstSlot(site, table.mask);; slot = (slot + 1) & table.mask) {
    const int64_t held = AtomicCas(table.keys + slot, -1, site);
    if (held == -1 || held == site) {
      AtomicMin(table.rows + slot, row);
      return;
    }
  }
}

// The row at `site`, or −1.
SL_HD inline int64_t Find(const SiteTable& table, int64_t site) {
  if (site < 0) return -1;
  for (int64_t slot = FirstSlot(site, table.mask);; slot = (slot + 1) & table.mask) {
    const int64_t key = table.keys[slot];
    if (key == site) return table.rows[slot];
    if (key == -1) return -1;
  }
}

}  // namespace bodies
}  // namespace sparse_lower
