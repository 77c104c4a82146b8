// Open-addressing hash map from linear site to row: how every builder finds a coordinate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sparse_lower {

// Memory is O(rows), never O(grid volume): the grids are 41×1440×1440 per batch while a real frame has
// ~80k active sites. Linear probing at load ≤ 1/2 with Fibonacci hashing: neighbouring sites land in
// different slots, and a lookup usually touches one cache line.
class SiteTable {
 public:
  explicit SiteTable(int64_t expected);

  // Stores site -> row unless the site is present; returns the row stored before, or -1.
  int64_t Insert(int64_t site, int64_t row);

  // The row stored under site (≥ 0), or -1.
  int64_t Find(int64_t site) const {
    for (uint64_t slot = Slot(site);; slot = (slot + 1) & mask_) {
      const Entry& entry = entries_[slot];
      if (entry.site == site) return entry.row;
      if (entry.site == kEmpty) return -1;
    }
  }

 private:
  struct Entry {
    int64_t site;
    int64_t row;
  };
  static constexpr int64_t kEmpty = -1;  // sites are ≥ 0

  uint64_t Slot(int64_t site) const { return (static_cast<uint64_t>(site) * 0x9E3779B97F4A7C15ull) >> shift_; }

  std::vector<Entry> entries_;
  uint64_t mask_ = 0;
  int shift_ = 0;
};

}  // namespace sparse_lower
