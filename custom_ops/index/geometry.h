// The geometry shared by the map builders: which input each tap of an output reads, and back.
#pragma once

#include <cstdint>
#include <vector>

#include "common/coords.h"
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
  bool Dense() const { return dense_; }  // source = "dense": nbr holds linear sites, not rows
  const Grid& In() const { return in_; }
  const Grid& Out() const { return out_; }
  // The largest batch for which linear sites of both grids fit in int64.
  int64_t MaxBatch() const { return std::min(in_.max_batch, out_.max_batch); }

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
  // Per dimension and tap index, the coordinate times the grid stride (or -1), then every tap as the
  // sum over dimensions: O(ΣK + D·ΠK) per point instead of O(D·ΠK) divisions.
  template <typename F>
  void Walk(const int64_t* point, bool to_input, std::vector<int64_t>& scratch, F& f) const {
    const Grid& grid = to_input ? in_ : out_;
    scratch.resize(partial_count_);
    int64_t* partial = scratch.data();
    for (size_t d = 0; d < axes_.size(); ++d) {
      const Axis& axis = axes_[d];
      for (int64_t k = 0; k < axis.kernel; ++k) {
        const int64_t c = to_input ? axis.InputOf(point[d], k) : axis.OutputOf(point[d], k);
        *partial++ = c < 0 ? -1 : c * grid.stride[d];
      }
    }
    const int64_t* slot = tap_slots_.data();
    const size_t dims = axes_.size();
    for (int64_t k = 0; k < taps_; ++k, slot += dims) {
      int64_t position = 0;
      size_t d = 0;
      for (; d < dims && scratch[slot[d]] >= 0; ++d) position += scratch[slot[d]];
      if (d == dims) f(k, position);
    }
  }

  std::vector<Axis> axes_;
  Grid in_;
  Grid out_;
  int64_t taps_ = 1;
  size_t partial_count_ = 0;        // ΣK
  std::vector<int64_t> tap_slots_;  // [taps, D]: where tap k's index along d sits in the partials
  bool dense_ = false;
};

}  // namespace sparse_lower
