#include "conv/tap_lists.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/status.h"
#include "common/vector_units.h"

namespace sparse_lower {
namespace {

[[noreturn]] void OutsideRows(const int64_t* idx, int64_t m, int64_t taps, int64_t inputs) {
  const int64_t* row = idx + m * taps;
  const int64_t k = std::find_if(row, row + taps, [&](int64_t v) { return v < -1 || v >= inputs; }) - row;
  Fail("idx value ", row[k], " (row ", m, ", tap ", k, ") is outside [0, ", inputs,
       "), the rows of X; only -1 marks a missing input");
}

#if defined(__x86_64__)
// A row's taps with an input as `bits` (bit k: idx[m, k] ≥ 0), four int64 entries per compare; false when
// an entry is outside [-1, inputs). Rows hold at most 64 taps on this path.
__attribute__((target("avx2"))) bool PresentBits(const int64_t* row, int64_t taps, int64_t inputs, uint64_t& bits) {
  const __m256i minus_one = _mm256_set1_epi64x(-1), last = _mm256_set1_epi64x(inputs - 1);
  bits = 0;
  bool bad = false;
  int64_t k = 0;
  for (; k + 4 <= taps; k += 4) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k));
    const __m256i outside = _mm256_or_si256(_mm256_cmpgt_epi64(minus_one, v), _mm256_cmpgt_epi64(v, last));
    bad |= !_mm256_testz_si256(outside, outside);
    bits |= static_cast<uint64_t>(_mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpgt_epi64(v, minus_one)))) << k;
  }
  for (; k < taps; ++k) {
    bad |= row[k] < -1 || row[k] >= inputs;
    bits |= static_cast<uint64_t>(row[k] >= 0) << k;
  }
  return !bad;
}
#endif

}  // namespace

template <typename T>
TapLists<T>::TapLists(int64_t taps, int64_t rows)
    : taps_(taps),
      rows_(rows),
      sources_(new const T*[static_cast<size_t>(taps * rows)]),
      targets_(new float*[static_cast<size_t>(taps * rows)]),
      counts_(static_cast<size_t>(taps)) {}

template <typename T>
void TapLists<T>::Fill(const int64_t* idx, int64_t begin, int64_t end, int64_t inputs, const T* x, int64_t stride,
                       float* y, int64_t cout) {
  std::fill(counts_.begin(), counts_.end(), 0);
#if defined(__x86_64__)
  if (HasVectorUnits() && taps_ <= 64) {  // only the taps present cost more than a compare
    for (int64_t m = begin; m < end; ++m) {
      const int64_t* row = idx + m * taps_;
      uint64_t bits;
      if (!PresentBits(row, taps_, inputs, bits)) OutsideRows(idx, m, taps_, inputs);
      for (; bits != 0; bits &= bits - 1) {
        const int64_t k = __builtin_ctzll(bits);
        const int64_t slot = k * rows_ + counts_[static_cast<size_t>(k)]++;
        sources_[slot] = x + row[k] * stride;
        targets_[slot] = y + m * cout;
      }
    }
    return;
  }
#endif
  for (int64_t m = begin; m < end; ++m) {
    const int64_t* row = idx + m * taps_;
    for (int64_t k = 0; k < taps_; ++k) {
      const int64_t source = row[k];
      if (source < -1 || source >= inputs) OutsideRows(idx, m, taps_, inputs);
      const int64_t slot = k * rows_ + counts_[static_cast<size_t>(k)];
      sources_[slot] = x + std::max<int64_t>(source, 0) * stride;  // overwritten when -1
      targets_[slot] = y + m * cout;
      counts_[static_cast<size_t>(k)] += source >= 0;
    }
  }
}

template class TapLists<float>;
template class TapLists<uint8_t>;
template class TapLists<uint16_t>;

}  // namespace sparse_lower
