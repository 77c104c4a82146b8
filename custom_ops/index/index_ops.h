// The index builders (docs/custom_ops.md, "Index builders"): coordinates in, index tables out.
#pragma once

#include <vector>

#include "common/coords.h"
#include "common/op.h"
#include "index/geometry.h"

namespace sparse_lower {

// nbr [N, K]: for each active site, the row each tap of a centred kernel reads.
class SubmanifoldMap {
 public:
  static constexpr const char* kName = "SubmanifoldMap";
  static constexpr InputSpec kInputs[] = {{kInt64, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64};

  explicit SubmanifoldMap(const Ort::ConstKernelInfo& info) : geometry_(info, MapKind::kSubmanifold) {}
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 private:
  MapGeometry geometry_;
};

// StridedMap and TransposedMap: the outputs are every output-grid site some input reaches, sorted.
class ReachedMap {
 public:
  static constexpr InputSpec kInputs[] = {{kInt64, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64, kInt64};

  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext&) {}  // both outputs have a data-dependent row count

 protected:
  ReachedMap(const Ort::ConstKernelInfo& info, MapKind kind) : geometry_(info, kind) {}

 private:
  MapGeometry geometry_;
};

// out_coords [M, 1+D], nbr [M, K] of a sparse convolution.
struct StridedMap : ReachedMap {
  static constexpr const char* kName = "StridedMap";
  explicit StridedMap(const Ort::ConstKernelInfo& info) : ReachedMap(info, MapKind::kStrided) {}
};

// out_coords [M, 1+D], nbr [M, K] of a sparse transposed convolution.
struct TransposedMap : ReachedMap {
  static constexpr const char* kName = "TransposedMap";
  explicit TransposedMap(const Ort::ConstKernelInfo& info) : ReachedMap(info, MapKind::kTransposed) {}
};

// nbr [M, K] of a transposed convolution whose outputs are given (submanifold inverse deconvolution).
class TargetMap {
 public:
  static constexpr const char* kName = "TargetMap";
  static constexpr InputSpec kInputs[] = {{kInt64, false}, {kInt64, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64};

  explicit TargetMap(const Ort::ConstKernelInfo& info) : geometry_(info, MapKind::kTransposed) {}
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 private:
  MapGeometry geometry_;
};

// For each of `groups` groups of taps: in_rows [Kg, Pg], out_rows [Kg, Pg], taps [Kg]. An
// output-stationary nbr turned weight-stationary, its taps grouped by pair count so that padding every
// tap of a group to the group's largest count wastes little.
class Rulebook {
 public:
  static constexpr const char* kName = "Rulebook";
  static constexpr InputSpec kInputs[] = {{kInt64, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64};
  static constexpr int kVariadicOutputs = 3;

  explicit Rulebook(const Ort::ConstKernelInfo& info);
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext&) {}  // every size is data-dependent

 private:
  int64_t groups_;
  std::vector<int64_t> skip_taps_;
};

// sites [N]: linear sites of coordinates in a dense [batch_size, C, *spatial_shape] tensor.
class SiteIndex {
 public:
  static constexpr const char* kName = "SiteIndex";
  static constexpr InputSpec kInputs[] = {{kInt64, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64};

  explicit SiteIndex(const Ort::ConstKernelInfo& info);
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext& ctx);

 private:
  Grid grid_;
  int64_t batch_size_;
};

// coords [N, 1+D], sites [N, 1]: the active sites of a dense [B, C, *S] tensor, sorted.
struct ActiveSites {
  static constexpr const char* kName = "ActiveSites";
  static constexpr InputSpec kInputs[] = {{kFloat, false}};
  static constexpr ONNXTensorElementDataType kOutputs[] = {kInt64, kInt64};

  explicit ActiveSites(const Ort::ConstKernelInfo&) {}
  void Compute(const Ort::KernelContext& ctx) const;
  static void InferShapes(const ShapeContext&) {}  // N is data-dependent
};

}  // namespace sparse_lower
