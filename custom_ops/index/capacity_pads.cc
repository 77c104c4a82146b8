// CapacityPads: the pads [0, ..., 0, capacity - N, 0, ..., 0] of a Pad that grows axis 0 of x to capacity.
#include "index/capacity_pads.h"

#include <algorithm>

#include "common/attributes.h"
#include "common/status.h"
#include "common/tensor.h"

namespace sparse_lower {

CapacityPads::CapacityPads(const Ort::ConstKernelInfo& info)
    : capacity_(Required(IntAttribute(info, "capacity"), "capacity")) {
  if (capacity_ < 0) Fail("attribute 'capacity' = ", capacity_, " must be at least 0");
}

void CapacityPads::Compute(const Ort::KernelContext& ctx) const {
  const std::vector<int64_t> shape = InputShape(ctx, 0);
  if (shape.empty()) Fail("x must have shape [N, ...], got a scalar");
  const int64_t rows = shape[0];
  // Never truncate: a fixed capacity below the active sites would drop some of them silently.
  if (rows > capacity_) {
    Fail("x has ", rows, " rows, more than the capacity ", capacity_, " (max_active); raise max_active to at least ",
         rows);
  }
  const auto rank = static_cast<int64_t>(shape.size());
  int64_t* pads = AllocateOutput<int64_t>(ctx, 0, {2 * rank});
  std::fill(pads, pads + 2 * rank, 0);
  pads[rank] = capacity_ - rows;  // ONNX Pad lists every begin, then every end: this is the end of axis 0
}

void CapacityPads::InferShapes(const ShapeContext& ctx) {
  // No shape at all reads as rank 0 here, like a scalar, which Compute refuses anyway.
  const auto rank = static_cast<int64_t>(ctx.Input(0).size());
  if (rank > 0) ctx.SetOutput(0, {2 * rank}, kInt64);
}

}  // namespace sparse_lower
