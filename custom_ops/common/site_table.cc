#include "common/site_table.h"

namespace sparse_lower {

SiteTable::SiteTable(int64_t expected) {
  int bits = 4;
  while ((int64_t{1} << bits) < 2 * expected) ++bits;
  entries_.assign(size_t{1} << bits, Entry{kEmpty, -1});
  mask_ = (uint64_t{1} << bits) - 1;
  shift_ = 64 - bits;
}

int64_t SiteTable::Insert(int64_t site, int64_t row) {
  for (uint64_t slot = Slot(site);; slot = (slot + 1) & mask_) {
    Entry& entry = entries_[slot];
    if (entry.site == site) return entry.row;
    if (entry.site == kEmpty) {
      entry = Entry{site, row};
      return -1;
    }
  }
}

}  // namespace sparse_lower
