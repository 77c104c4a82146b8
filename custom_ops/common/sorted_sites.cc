#include "common/sorted_sites.h"

#include <algorithm>

namespace sparse_lower {

int64_t Cursor::Find(int64_t site) {
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

}  // namespace sparse_lower
