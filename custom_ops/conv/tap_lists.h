// The rows of a block of IndexedConv's output that read an input through each tap, as the addresses the
// row GEMM (conv/row_gemm.h) multiplies from and into. T: the input rows' element (float, or uint8_t for
// IndexedConvInt8's quantized rows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace sparse_lower {

template <typename T>
class TapLists {
 public:
  // Room for `taps` lists of up to `rows` entries each.
  TapLists(int64_t taps, int64_t rows);

  // Lists output rows [begin, end) of the table idx [M, taps] (-1: no input): tap k's list holds, in
  // ascending row order, x + idx[m, k]·stride and y + m·cout for every m with idx[m, k] ≥ 0. An entry
  // outside [-1, inputs) is an error naming its row and tap (the first in row-major order).
  void Fill(const int64_t* idx, int64_t begin, int64_t end, int64_t inputs, const T* x, int64_t stride, float* y,
            int64_t cout);

  const T* const* Sources(int64_t k) const { return sources_.get() + k * rows_; }
  float* const* Targets(int64_t k) const { return targets_.get() + k * rows_; }
  int64_t Count(int64_t k) const { return counts_[static_cast<size_t>(k)]; }

 private:
  int64_t taps_, rows_;
  // Left uninitialised: Fill writes every entry that is read, and zeroing taps × rows pointers per block
  // cost more than listing them.
  std::unique_ptr<const T*[]> sources_;
  std::unique_ptr<float*[]> targets_;
  std::vector<int64_t> counts_;
};

}  // namespace sparse_lower
