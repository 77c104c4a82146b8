#include "conv/conv_rows.h"

#include <algorithm>

#include "common/coords.h"
#include "common/status.h"
#include "common/tensor.h"

namespace sparse_lower {

ConvShapes CheckConvShapes(const Ort::KernelContext& ctx, const std::vector<int64_t>& x,
                           const std::vector<int64_t>& idx, const std::vector<int64_t>& w, size_t optional) {
  if (x.size() != 2) Fail("X must be rows [N, Cin], got shape ", List(x));
  if (idx.size() != 2) Fail("idx must be a table [M, K], got shape ", List(idx));
  if (w.size() != 3 || w[0] != idx[1] || w[1] != x[1]) {
    Fail("W must have shape [K, Cin, Cout] = [", idx[1], ", ", x[1], ", Cout], got ", List(w));
  }
  const ConvShapes shapes{x[0], x[1], idx[0], idx[1], w[2]};
  if (HasInput(ctx, optional)) {
    const std::vector<int64_t> bias = InputShape(ctx, optional);
    if (bias != std::vector<int64_t>{shapes.cout}) {
      Fail("B must have shape [Cout] = [", shapes.cout, "], got ", List(bias));
    }
  }
  CheckCoordsPairing(ctx, optional + 1, shapes.inputs);
  if (HasInput(ctx, optional + 2)) {
    const std::vector<int64_t> residual = InputShape(ctx, optional + 2);
    if (residual != std::vector<int64_t>{shapes.rows, shapes.cout}) {
      Fail("R must have shape [M, Cout] = [", shapes.rows, ", ", shapes.cout, "] (a residual on the output rows), got ",
           List(residual));
    }
  }
  return shapes;
}

void StartRows(float* y, const float* bias, int64_t begin, int64_t end, int64_t cout) {
  for (int64_t m = begin; m < end; ++m) {
    float* row = y + m * cout;
    if (bias == nullptr) {
      std::fill(row, row + cout, 0.0f);
    } else {
      std::copy_n(bias, cout, row);
    }
  }
}

void FinishRows(float* y, const float* residual, bool relu, int64_t begin, int64_t end, int64_t cout) {
  if (residual != nullptr) {
    for (int64_t i = begin * cout; i < end * cout; ++i) y[i] += residual[i];
  }
  if (relu) {
    for (int64_t i = begin * cout; i < end * cout; ++i) y[i] = y[i] < 0.0f ? 0.0f : y[i];
  }
}

}  // namespace sparse_lower
