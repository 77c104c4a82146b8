// The geometry shared by the map builders: which input each tap of an output reads, and back.
#pragma once

#include <cstdint>
#include <vector>

#include "common/coords.h"
#include "cuda/shapes.h"
#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

// How an output coordinate o, a tap index k and an input coordinate i relate along one dimension
// (p is the begin pad):
//   convolution             i = o·s − p + k·d
//   transposed convolution  o = i·s − p + k·d
// A submanifold map is the convolution with s = 1 and p = (K − 1)/2·d on the input grid.
struct Axis {
  // The input read by tap k of output o, or -1 when there is none in the input grid.
  int64_t InputOf(int64_t o, int64_t k) const {
    return transposed ? Exact(o + pad - k * dilation, in_extent) : Inside(o * stride - pad + k * dilation, in_extent);
  }
  // The output that input i feeds through tap k, or -1 when there is none in the output grid.
  int64_t OutputOf(int64_t i, int64_t k) const {
    return transposed ? Inside(i * stride - pad + k * dilation, out_extent) : Exact(i + pad - k * dilation, out_extent);
  }

  int64_t kernel, stride, pad, dilation, in_extent, out_extent;
  bool transposed;

 private:
  static int64_t Inside(int64_t c, int64_t extent) { return c >= 0 && c < extent ? c : -1; }
  int64_t Exact(int64_t t, int64_t extent) const { return t % stride == 0 ? Inside(t / stride, extent) : -1; }
};

enum class MapKind { kSubmanifold, kStrided, kTransposed };

// The attributes of a map builder, checked, and the input and output grids they imply.
class MapGeometry {
 public:
  MapGeometry(const Ort::ConstKernelInfo& info, MapKind kind);

  size_t Dims() const { return axes_.size(); }
  int64_t Taps() const { return taps_; }
  const std::vector<Axis>& Axes() const { return axes_; }
  bool Dense() const { return dense_; }  // source = "dense": nbr holds linear sites, not rows
  bool Transposed() const { return axes_.front().transposed; }
  const Grid& In() const { return in_; }
  const Grid& Out() const { return out_; }
  // The largest batch for which linear sites of both grids fit in int64.
  int64_t MaxBatch() const { return std::min(in_.max_batch, out_.max_batch); }
  // The geometry as plain data, as the CUDA kernels take it (cuda/bodies/maps.h).
  SlMapShape Shape() const;

  // Calls f(k, position) for every tap k of the output at spatial coordinate o whose input lies in the
  // input grid; position is that input's linear position within its grid. scratch: reused memory.
  template <typename F>
  void ForEachInput(const int64_t* o, std::vector<int64_t>& scratch, F&& f) const {
    Walk(o, /*to_input=*/true, scratch, f);
  }

  // Calls f(k, position) for every tap k through which the input at spatial coordinate i reaches an
  // output inside the output grid; position is that output's linear position within its grid.
  template <typename F>
  void ForEachOutput(const int64_t* i, std::vector<int64_t>& scratch, F&& f) const {
    Walk(i, /*to_input=*/false, scratch, f);
  }

 private:
  // Per dimension, the taps that stay inside the grid as (tap index part, coordinate · grid stride),
  // then every combination of them in row-major order: O(ΣK + hits) per point, so a strided conv's
  // walk from its inputs skips the taps that do not divide evenly instead of testing all ΠK of them.
  // Grids of fewer than kMaxDims dimensions walk leading dimensions of one (0, 0) part. The parts of
  // every coordinate are listed once, at construction, where the extents are small (AxisParts); else
  // they are computed per point into `scratch`.
  template <typename F>
  void Walk(const int64_t* point, bool to_input, std::vector<int64_t>& scratch, F& f) const {
    const Grid& grid = to_input ? in_ : out_;
    const size_t skipped = kMaxDims - axes_.size();
    const int64_t* first[kMaxDims];
    const int64_t* last[kMaxDims];
    static constexpr int64_t kNone[2] = {0, 0};
    for (size_t d = 0; d < skipped; ++d) {
      first[d] = kNone;
      last[d] = kNone + 2;
    }
    const std::vector<AxisParts>& listed = to_input ? input_parts_ : output_parts_;
    scratch.resize(2 * partial_count_);
    int64_t* part = scratch.data();
    for (size_t d = skipped; d < kMaxDims; ++d) {
      const int64_t v = point[d - skipped];
      if (!listed.empty() && v >= 0 && v + 1 < static_cast<int64_t>(listed[d - skipped].start.size())) {
        const AxisParts& parts = listed[d - skipped];
        first[d] = parts.parts.data() + 2 * parts.start[static_cast<size_t>(v)];
        last[d] = parts.parts.data() + 2 * parts.start[static_cast<size_t>(v) + 1];
        continue;
      }
      first[d] = part;
      const Axis& axis = axes_[d - skipped];
      for (int64_t k = 0; k < axis.kernel; ++k) {
        const int64_t c = to_input ? axis.InputOf(v, k) : axis.OutputOf(v, k);
        if (c < 0) continue;
        *part++ = k * tap_stride_[d - skipped];
        *part++ = c * grid.stride[d - skipped];
      }
      last[d] = part;
    }
    static_assert(kMaxDims == 3, "one loop per dimension");
    for (const int64_t* a = first[0]; a < last[0]; a += 2) {
      for (const int64_t* b = first[1]; b < last[1]; b += 2) {
        for (const int64_t* c = first[2]; c < last[2]; c += 2) f(a[0] + b[0] + c[0], a[1] + b[1] + c[1]);
      }
    }
  }

  // One dimension's parts for every coordinate of its grid: those of coordinate v are the pairs
  // [start[v], start[v + 1]) of `parts` (tap index part, coordinate · grid stride).
  struct AxisParts {
    std::vector<int64_t> start;
    std::vector<int64_t> parts;
  };
  // Both directions' AxisParts, where they hold at most kListedParts pairs in all; else none.
  void ListParts();

  std::vector<Axis> axes_;
  Grid in_;
  Grid out_;
  int64_t taps_ = 1;
  size_t partial_count_ = 0;      // ΣK
  int64_t tap_stride_[kMaxDims];  // tap index = Σ k_d · tap_stride_[d]: row-major, the ONNX weight order
  bool dense_ = false;
  std::vector<AxisParts> input_parts_;   // per dimension, from an output coordinate (ForEachInput)
  std::vector<AxisParts> output_parts_;  // per dimension, from an input coordinate (ForEachOutput)
};

}  // namespace sparse_lower
