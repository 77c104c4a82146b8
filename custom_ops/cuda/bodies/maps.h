// The geometry of the map builders, per (row, tap): which input a tap of an output reads, and which
// output an input reaches through a tap (the relation of index/geometry.h, one tap at a time, for a GPU
// thread per (row, tap)).
#pragma once

#include <cstdint>

#include "cuda/bodies/sites.h"
#include "cuda/hd.h"
#include "cuda/shapes.h"

namespace sparse_lower {
namespace bodies {

// The geometry (cuda/shapes.h): plain C data, which the C ABI takes as it is and a launch copies to the
// device by value.
using AxisShape = SlAxis;
using MapShape = SlMapShape;

SL_HD inline int64_t Taps(const MapShape& map) {
  int64_t taps = 1;
  for (int d = 0; d < map.dims; ++d) taps *= map.axis[d].kernel;
  return taps;
}

SL_HD inline GridShape InGrid(const MapShape& map) {
  int64_t extent[kMaxDims];
  for (int d = 0; d < map.dims; ++d) extent[d] = map.axis[d].in_extent;
  return MakeGrid(map.dims, extent);
}

SL_HD inline GridShape OutGrid(const MapShape& map) {
  int64_t extent[kMaxDims];
  for (int d = 0; d < map.dims; ++d) extent[d] = map.axis[d].out_extent;
  return MakeGrid(map.dims, extent);
}

// c inside [0, extent), else −1.
SL_HD inline int64_t Inside(int64_t c, int64_t extent) { return c >= 0 && c < extent ? c : -1; }

// t / s inside [0, extent) where s divides t, else −1.
SL_HD inline int64_t Exact(int64_t t, int64_t stride, int64_t extent) {
  return t % stride == 0 ? Inside(t / stride, extent) : -1;
}

// Along one axis: the input tap k of output o reads, or −1 outside the input grid.
SL_HD inline int64_t InputOf(const AxisShape& a, bool transposed, int64_t o, int64_t k) {
  return transposed ? Exact(o + a.pad - k * a.dilation, a.stride, a.in_extent)
                    : Inside(o * a.stride - a.pad + k * a.dilation, a.in_extent);
}

// Along one axis: the output input i reaches through tap k, or −1 outside the output grid.
SL_HD inline int64_t OutputOf(const AxisShape& a, bool transposed, int64_t i, int64_t k) {
  return transposed ? Inside(i * a.stride - a.pad + k * a.dilation, a.out_extent)
                    : Exact(i + a.pad - k * a.dilation, a.stride, a.out_extent);
}

// The linear site in `to` of the point that tap k links to coordinate c = (batch, d0, ...): the input
// it reads (to_input) or the output it reaches; −1 where that point leaves the grid. Taps are numbered
// in row-major order of the kernel, the ONNX weight order.
SL_HD inline int64_t TapSite(const MapShape& map, const GridShape& to, const int64_t* c, int64_t k, bool to_input) {
  int64_t position = 0;
  for (int d = map.dims; d-- > 0;) {
    const AxisShape& a = map.axis[d];
    const int64_t part = k % a.kernel;
    k /= a.kernel;
    const int64_t at = to_input ? InputOf(a, map.transposed != 0, c[1 + d], part)
                                : OutputOf(a, map.transposed != 0, c[1 + d], part);
    if (at < 0) return -1;
    position += at * to.stride[d];
  }
  return c[0] * to.volume + position;
}

// nbr[m, k] of an output at coordinate c: the row of the input tap k reads (found in `table`), or its
// linear site for a dense source (every in-grid input, active or not); −1 where there is none.
SL_HD inline int64_t Neighbour(const MapShape& map, const GridShape& in, const int64_t* c, int64_t k, bool dense,
                               const SiteTable& table) {
  const int64_t site = TapSite(map, in, c, k, /*to_input=*/true);
  if (site < 0 || dense) return site;
  return Find(table, site);
}

}  // namespace bodies
}  // namespace sparse_lower
