// The linear sites of a coordinate table in ascending order with the row of each: how every builder
// finds a coordinate.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace sparse_lower {

// Memory is O(rows), never O(grid volume): the grids are 41×1440×1440 per batch while a real frame has
// ~80k active sites. Why sorted rather than hashed: the builders look sites up tap by tap for outputs
// in ascending order, and for a fixed tap those sites ascend too (the tap's offset is the same for
// every output, and each axis map is monotone). A Cursor per tap then mostly moves one step along one
// array instead of probing a hash table at random (SubmanifoldMap on the sorted real frame: 30 → 25 ms).
struct SortedSites {
  std::vector<int64_t> site;  // ascending, distinct
  std::vector<int64_t> row;   // row[i]: the row of the coordinate table at site[i]
};

// Finds a sequence of sites in an ascending, distinct list, each search starting where the previous one
// ended: O(1) per lookup when the sites ascend slowly, O(log N) at worst, and correct in any order.
class Cursor {
 public:
  explicit Cursor(const std::vector<int64_t>& sites) : sites_(&sites) {}

  // The position of `site` in the list, or -1 when it is not there. Inline: the map builders call it once
  // per (output, tap), and the call cost as much as the few steps it mostly takes.
  int64_t Find(int64_t site) {
    const std::vector<int64_t>& sites = *sites_;
    const auto count = static_cast<int64_t>(sites.size());
    constexpr int64_t kSteps = 4;  // a few single steps, then a binary search of the rest
    if (at_ > 0 && sites[at_ - 1] >= site) {
      at_ = std::lower_bound(sites.begin(), sites.begin() + at_, site) - sites.begin();
    } else {
      for (int64_t step = 0; step < kSteps && at_ < count && sites[at_] < site; ++step) ++at_;
      if (at_ < count && sites[at_] < site) at_ = std::lower_bound(sites.begin() + at_, sites.end(), site) - sites.begin();
    }
    return at_ < count && sites[at_] == site ? at_ : -1;
  }

 private:
  const std::vector<int64_t>* sites_;
  int64_t at_ = 0;  // the first position whose site is ≥ the last one looked up
};

}  // namespace sparse_lower
