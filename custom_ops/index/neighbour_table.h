// A neighbour table as the nna tables read it: nbr [M, K] and the row count N of the inputs it indexes.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

struct NeighbourTable {
  const int64_t* data;
  int64_t rows;    // M, the outputs
  int64_t taps;    // K
  int64_t inputs;  // N

  // nbr[m, k], which must be -1 or a row in [0, N): the tables built from it are indexed by it.
  int64_t At(int64_t m, int64_t k) const {
    const int64_t row = data[m * taps + k];
    if (row < -1 || row >= inputs) {
      Fail("nbr[", m, ", ", k, "] = ", row, " is neither -1 nor a row of like, in [0, ", inputs, ")");
    }
    return row;
  }
};

// nbr from input 0, N from the first dimension of input 1 (`like`, of any element type).
NeighbourTable ReadNeighbourTable(const Ort::KernelContext& ctx);

}  // namespace sparse_lower
