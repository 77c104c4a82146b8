// IndexedUnfold and IndexedFold per element (docs/custom_ops.md: Data movement).
#pragma once

#include <cstdint>

#include "cuda/hd.h"

namespace sparse_lower {
namespace bodies {

// Whether v may index one of `limit` rows or sites: −1 (none) or inside [0, limit).
SL_HD inline bool ValidIndex(int64_t v, int64_t limit) { return v == -1 || (v >= 0 && v < limit); }

// The offset of channel c of `at` in X or Y: row `at` of [N, C], or for a dense [B, C, *S] linear site
// at = b·V + position, which lies at [b, c, position].
SL_HD inline int64_t ChannelOffset(int64_t at, int64_t c, int64_t channels, int64_t volume, bool dense) {
  return dense ? (at / volume) * channels * volume + c * volume + at % volume : at * channels + c;
}

// Y[r, k, c] of IndexedUnfold: channel c of input `source` (idx[r, k]) of `limit`, 0 where it is −1 (or
// outside [0, limit): refused by the op's check, which a stream may report later).
SL_HD inline float UnfoldValue(const float* x, int64_t limit, int64_t source, int64_t c, int64_t channels,
                               int64_t volume, bool dense) {
  return source >= 0 && source < limit ? x[ChannelOffset(source, c, channels, volume, dense)] : 0.0f;
}

// The first position of `sorted` [0, n) holding a value ≥ `value`.
SL_HD inline int64_t LowerBound(const int64_t* sorted, int64_t n, int64_t value) {
  int64_t low = 0;
  while (n > 0) {
    const int64_t half = n / 2;
    if (sorted[low + half] < value) {
      low += half + 1;
      n -= half + 1;
    } else {
      n = half;
    }
  }
  return low;
}

// Channel c of one target of IndexedFold: `start` plus the rows its entries name, in ascending entry
// order (entries[begin, end): the positions p of idx holding this target, ascending), as the CPU
// kernel adds them.
SL_HD inline float FoldValue(float start, const float* rows, const int64_t* entries, int64_t begin, int64_t end,
                             int64_t c, int64_t channels) {
  float value = start;
  for (int64_t i = begin; i < end; ++i) value += rows[entries[i] * channels + c];
  return value;
}

}  // namespace bodies
}  // namespace sparse_lower
