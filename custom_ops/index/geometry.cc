#include "index/geometry.h"

#include <string>

#include "common/attributes.h"
#include "common/status.h"

namespace sparse_lower {
namespace {

// Attribute values stay below 2^30 so that every coordinate computation fits in int64.
constexpr int64_t kLimit = int64_t{1} << 30;

// Checks an integer list attribute: `length` values in [low, 2^30).
const std::vector<int64_t>& Check(const char* name, const std::vector<int64_t>& values, size_t length, int64_t low) {
  if (values.size() != length) Fail("attribute '", name, "' has ", values.size(), " values, expected ", length);
  for (const int64_t v : values) {
    if (v < low || v >= kLimit) Fail("attribute '", name, "' = ", List(values), " needs values in [", low, ", 2^30)");
  }
  return values;
}

// An optional integer list attribute, `length` times `fill` when missing.
std::vector<int64_t> Ints(const Ort::ConstKernelInfo& info, const char* name, size_t length, int64_t fill,
                          int64_t low) {
  return Check(name, IntsAttribute(info, name).value_or(std::vector<int64_t>(length, fill)), length, low);
}

}  // namespace

MapGeometry::MapGeometry(const Ort::ConstKernelInfo& info, MapKind kind) {
  in_ = Required(SpatialShape(info), "spatial_shape");
  const std::vector<int64_t>& shape = Check("spatial_shape", in_.extent, in_.Dims(), 1);
  const size_t n = shape.size();
  const std::vector<int64_t> kernel = Required(IntsAttribute(info, "kernel_shape"), "kernel_shape");
  Check("kernel_shape", kernel, n, 1);
  const std::vector<int64_t> dilations = Ints(info, "dilations", n, 1, 1);
  const bool submanifold = kind == MapKind::kSubmanifold;
  const std::vector<int64_t> strides = submanifold ? std::vector<int64_t>(n, 1) : Ints(info, "strides", n, 1, 1);
  const std::vector<int64_t> pads = submanifold ? std::vector<int64_t>(2 * n, 0) : Ints(info, "pads", 2 * n, 0, 0);
  const std::vector<int64_t> output_padding =
      kind == MapKind::kTransposed ? Ints(info, "output_padding", n, 0, 0) : std::vector<int64_t>(n, 0);

  std::vector<int64_t> out_shape(n);
  for (size_t d = 0; d < n; ++d) {
    const int64_t reach = dilations[d] * (kernel[d] - 1);
    Axis axis{kernel[d], strides[d], pads[d], dilations[d], shape[d], shape[d], kind == MapKind::kTransposed};
    if (submanifold) {
      if (kernel[d] % 2 == 0) Fail("attribute 'kernel_shape' = ", List(kernel), " must be odd (the map is centred)");
      axis.pad = reach / 2;
    } else if (kind == MapKind::kStrided) {
      // S_out = floor(span / s) + 1; C++ division truncates, so a negative span (no output) is explicit.
      const int64_t span = shape[d] + pads[d] + pads[n + d] - reach - 1;
      axis.out_extent = span < 0 ? 0 : span / strides[d] + 1;
    } else {
      axis.out_extent = strides[d] * (shape[d] - 1) + output_padding[d] + reach + 1 - pads[d] - pads[n + d];
    }
    out_shape[d] = axis.out_extent;
    axes_.push_back(axis);
  }
  out_ = Grid(out_shape, "output grid");

  for (const int64_t k : kernel) {
    if (__builtin_mul_overflow(taps_, k, &taps_)) Fail("kernel_shape = ", List(kernel), " has too many taps");
    partial_count_ += static_cast<size_t>(k);
  }
  // Taps in row-major order of the kernel (the ONNX weight order): the last dimension varies fastest.
  for (size_t d = n, stride = 1; d-- > 0; stride *= static_cast<size_t>(kernel[d])) {
    tap_stride_[d] = static_cast<int64_t>(stride);
  }
  dense_ = Choice(info, "source", {"rows", "dense"}) == 1;
  ListParts();
}

void MapGeometry::ListParts() {
  // 2^20 pairs (16 MiB) at most: the 41×1440×1440 grid's 3³ kernel lists 8,763 pairs per direction.
  constexpr int64_t kListedParts = int64_t{1} << 20;
  int64_t pairs = 0;
  for (const Axis& axis : axes_) {
    if (axis.in_extent > kListedParts || axis.out_extent > kListedParts) return;
    pairs += (axis.in_extent + axis.out_extent) * axis.kernel;
  }
  if (pairs > kListedParts) return;
  for (size_t d = 0; d < axes_.size(); ++d) {
    const Axis& axis = axes_[d];
    for (const bool to_input : {true, false}) {
      AxisParts listed;
      const int64_t extent = to_input ? axis.out_extent : axis.in_extent;  // the coordinates a walk starts from
      const int64_t stride = (to_input ? in_ : out_).stride[d];
      listed.start.push_back(0);
      for (int64_t v = 0; v < extent; ++v) {
        for (int64_t k = 0; k < axis.kernel; ++k) {
          const int64_t c = to_input ? axis.InputOf(v, k) : axis.OutputOf(v, k);
          if (c < 0) continue;
          listed.parts.push_back(k * tap_stride_[d]);
          listed.parts.push_back(c * stride);
        }
        listed.start.push_back(static_cast<int64_t>(listed.parts.size() / 2));
      }
      (to_input ? input_parts_ : output_parts_).push_back(std::move(listed));
    }
  }
}

SlMapShape MapGeometry::Shape() const {
  SlMapShape shape{};
  shape.dims = static_cast<int32_t>(axes_.size());
  for (size_t d = 0; d < axes_.size(); ++d) {
    const Axis& a = axes_[d];
    shape.transposed = a.transposed ? 1 : 0;
    shape.axis[d] = SlAxis{a.kernel, a.stride, a.pad, a.dilation, a.in_extent, a.out_extent};
  }
  return shape;
}

}  // namespace sparse_lower
