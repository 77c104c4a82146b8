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

 private:
  // Whether a strided map of `inputs` rows and `outputs` outputs fills at least one in 9 of its table's
  // slots. Then looking each output's taps up (LineNeighbours), which writes each row of the table once
  // while it is in cache, beats scattering each input's pairs (SiteBits::ScatterNeighbours), which fills
  // the whole table with -1 first and costs per pair rather than per slot. On the real frames, 2 threads:
  // the CenterPoint frame's first StridedMap (1 slot in 7 filled) 4.0 → 3.8 ms by lookups, the BEVFusion
  // frame's (1 in 12.5) 1.6 ms by the scatter, 1.9 ms by lookups.
  bool Filled(int64_t inputs, int64_t outputs) const;
};

}  // namespace sparse_lower
