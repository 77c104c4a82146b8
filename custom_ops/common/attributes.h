// Node attributes as read by kernel constructors: a missing attribute is told apart from a present one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

// Each returns nothing when the node lacks the attribute (or holds it with another type).
std::optional<std::vector<int64_t>> IntsAttribute(const Ort::ConstKernelInfo& info, const char* name);
std::optional<int64_t> IntAttribute(const Ort::ConstKernelInfo& info, const char* name);
std::optional<std::string> StringAttribute(const Ort::ConstKernelInfo& info, const char* name);

// The value of a required attribute, or an error naming it.
template <typename T>
T Required(std::optional<T> value, const char* name) {
  if (!value) Fail("attribute '", name, "' is required");
  return *std::move(value);
}

// The index in `choices` of a string attribute; choices[0] when it is missing.
size_t Choice(const Ort::ConstKernelInfo& info, const char* name, const std::vector<std::string>& choices);

}  // namespace sparse_lower
