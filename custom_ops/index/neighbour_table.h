// A neighbour table nbr [M, K] (docs/custom_ops.md, conventions): its shape as the map builders infer
// it, and the one reading and checking of it as an input, for every op that takes one (Rulebook,
// InverseMap, ScatterMatrices), so that a bad table gets the same refusal whichever op reads it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/shape_context.h"
#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

// Output 0 as nbr [rows of input `index`, Π kernel_shape], when both are known.
void InferNeighbourTable(const ShapeContext& ctx, size_t index);

// nbr [M, K], input 0 of the kernel, whose entries are checked as they are read (At): each must be -1 or
// a row index, below N where the op knows the rows it indexes.
class NeighbourTable {
 public:
  // Without `like`: any row index ≥ 0 is accepted (Rulebook, which never sees the inputs).
  static NeighbourTable Read(const Ort::KernelContext& ctx);
  // N from the first dimension of input 1 (`like`, of any element type): entries must lie in [-1, N).
  static NeighbourTable ReadWithLike(const Ort::KernelContext& ctx);

  // nbr[m, k], refused (naming m, k and the value) unless -1 or a row the table may name.
  int64_t At(int64_t m, int64_t k) const {
    const int64_t row = data[m * taps + k];
    if (row < -1 || row > last_row_) Refuse(m, k, row);
    return row;
  }

  const int64_t* data;
  int64_t rows;    // M, the outputs
  int64_t taps;    // K
  int64_t inputs;  // N, the rows of `like`; -1 when read without it

 private:
  NeighbourTable(const int64_t* data, int64_t rows, int64_t taps, int64_t inputs);
  [[noreturn]] void Refuse(int64_t m, int64_t k, int64_t row) const;

  int64_t last_row_;  // N - 1, or the largest int64 without `like`
};

}  // namespace sparse_lower
