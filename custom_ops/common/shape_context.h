// What an op's shape inference sees: input shapes and attributes; and where it sets output shapes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

// A dimension: a size, a symbol shared with an input, or unknown.
struct Dim {
  Dim() = default;
  Dim(int64_t size) : value(size) {}  // NOLINT: sizes convert implicitly

  bool Known() const { return value >= 0 || !symbol.empty(); }

  int64_t value = -1;
  std::string symbol;
};

using Shape = std::vector<Dim>;

// Shape inference reads attributes through the C API rather than Ort::ShapeInferContext, whose readers
// throw on a missing attribute and leak a status on multi-valued ones.
class ShapeContext {
 public:
  explicit ShapeContext(OrtShapeInferContext* ctx);

  size_t InputCount() const { return inputs_.size(); }
  const Shape& Input(size_t index) const { return inputs_.at(index); }

  std::optional<std::vector<int64_t>> Ints(const char* name) const;
  std::optional<int64_t> Int(const char* name) const;
  std::optional<std::string> String(const char* name) const;

  // Declares output `index` when every dimension is known. onnxruntime has no way to say "unknown
  // size" here, and a made-up symbol would claim that unrelated sizes are equal, so data-dependent
  // outputs keep their type only.
  void SetOutput(size_t index, const Shape& shape, ONNXTensorElementDataType type) const;

 private:
  const OrtOpAttr* Attribute(const char* name) const;

  OrtShapeInferContext* ctx_;
  std::vector<Shape> inputs_;
};

}  // namespace sparse_lower
