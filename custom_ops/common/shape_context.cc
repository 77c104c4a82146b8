#include "common/shape_context.h"

#include <cstring>

namespace sparse_lower {
namespace {

const OrtApi& Api() { return Ort::GetApi(); }

// Calls a C API function that may fail, dropping the failure: for probes whose failure is an answer.
bool Succeeds(OrtStatus* status) {
  if (status == nullptr) return true;
  Api().ReleaseStatus(status);
  return false;
}

}  // namespace

ShapeContext::ShapeContext(OrtShapeInferContext* ctx) : ctx_(ctx) {
  size_t count = 0;
  Ort::ThrowOnError(Api().ShapeInferContext_GetInputCount(ctx_, &count));
  for (size_t i = 0; i < count; ++i) {
    OrtTensorTypeAndShapeInfo* raw = nullptr;  // owned by the context
    Ort::ThrowOnError(Api().ShapeInferContext_GetInputTypeShape(ctx_, i, &raw));
    const Ort::ConstTensorTypeAndShapeInfo info(raw);
    const std::vector<int64_t> sizes = info.GetShape();
    std::vector<const char*> symbols(sizes.size(), nullptr);
    if (!sizes.empty()) info.GetSymbolicDimensions(symbols.data(), symbols.size());
    Shape shape(sizes.size());
    for (size_t d = 0; d < sizes.size(); ++d) {
      shape[d].value = sizes[d];
      if (symbols[d] != nullptr) shape[d].symbol = symbols[d];
    }
    inputs_.push_back(std::move(shape));
  }
}

const OrtOpAttr* ShapeContext::Attribute(const char* name) const {
  const OrtOpAttr* attr = nullptr;
  return Succeeds(Api().ShapeInferContext_GetAttribute(ctx_, name, &attr)) ? attr : nullptr;
}

std::optional<std::vector<int64_t>> ShapeContext::Ints(const char* name) const {
  const OrtOpAttr* attr = Attribute(name);
  if (attr == nullptr) return std::nullopt;
  size_t bytes = 0;
  Succeeds(Api().ReadOpAttr(attr, ORT_OP_ATTR_INTS, nullptr, 0, &bytes));  // asks for the size
  std::vector<int64_t> values(bytes / sizeof(int64_t));
  if (!Succeeds(Api().ReadOpAttr(attr, ORT_OP_ATTR_INTS, values.data(), bytes, &bytes))) return std::nullopt;
  return values;
}

std::optional<int64_t> ShapeContext::Int(const char* name) const {
  const OrtOpAttr* attr = Attribute(name);
  int64_t value = 0;
  size_t bytes = 0;
  if (attr == nullptr || !Succeeds(Api().ReadOpAttr(attr, ORT_OP_ATTR_INT, &value, sizeof(value), &bytes))) {
    return std::nullopt;
  }
  return value;
}

std::optional<std::string> ShapeContext::String(const char* name) const {
  const OrtOpAttr* attr = Attribute(name);
  if (attr == nullptr) return std::nullopt;
  size_t bytes = 0;
  Succeeds(Api().ReadOpAttr(attr, ORT_OP_ATTR_STRING, nullptr, 0, &bytes));  // asks for the size
  // Whether that size counts a terminating '\0' differs between onnxruntime versions: leave room for
  // one and cut at the first.
  std::string value(bytes + 1, '\0');
  if (!Succeeds(Api().ReadOpAttr(attr, ORT_OP_ATTR_STRING, value.data(), value.size(), &bytes))) return std::nullopt;
  value.resize(std::strlen(value.c_str()));
  return value;
}

void ShapeContext::SetOutput(size_t index, const Shape& shape, ONNXTensorElementDataType type) const {
  std::vector<int64_t> sizes;
  std::vector<const char*> symbols;
  for (const Dim& dim : shape) {
    if (!dim.Known()) return;
    sizes.push_back(dim.symbol.empty() ? dim.value : -1);
    symbols.push_back(dim.symbol.c_str());
  }
  OrtTensorTypeAndShapeInfo* raw = nullptr;
  Ort::ThrowOnError(Api().CreateTensorTypeAndShapeInfo(&raw));
  const Ort::TensorTypeAndShapeInfo owner(raw);  // releases it
  Ort::ThrowOnError(Api().SetTensorElementType(raw, type));
  Ort::ThrowOnError(Api().SetDimensions(raw, sizes.data(), sizes.size()));
  Ort::ThrowOnError(Api().SetSymbolicDimensions(raw, symbols.data(), symbols.size()));
  Ort::ThrowOnError(Api().ShapeInferContext_SetOutputTypeShape(ctx_, index, raw));
}

}  // namespace sparse_lower
