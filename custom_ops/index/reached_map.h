// The kernel StridedMap and TransposedMap share (index/strided_map.h, index/transposed_map.h): their
// outputs are every output-grid site some input reaches, and only the geometry tells them apart.
#pragma once

#include "common/op.h"
#include "index/geometry.h"

namespace sparse_lower {

// out_coords [M, 1+D], sorted, and nbr [M, K] of the outputs some input reaches through some tap.
class ReachedMap {
 public:
  static constexpr InputSpec kInputs[] = {{kInt64, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64, kInt64};

  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext&) {}  // both outputs have a data-dependent row count

 protected:  // the CUDA kernels (cuda/device/ops.cu) derive from these, sharing their checks
  ReachedMap(const Ort::ConstKernelInfo& info, MapKind kind) : geometry_(info, kind) {}

  MapGeometry geometry_;
};

}  // namespace sparse_lower
