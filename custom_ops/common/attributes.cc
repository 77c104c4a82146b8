#include "common/attributes.h"

namespace sparse_lower {
namespace {

// onnxruntime reports a missing attribute as an error status, which the C++ wrapper throws.
template <typename F>
auto Optional(F&& read) -> std::optional<decltype(read())> {
  try {
    return read();
  } catch (const Ort::Exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<std::vector<int64_t>> IntsAttribute(const Ort::ConstKernelInfo& info, const char* name) {
  return Optional([&] { return info.GetAttributes<int64_t>(name); });
}

std::optional<int64_t> IntAttribute(const Ort::ConstKernelInfo& info, const char* name) {
  return Optional([&] { return info.GetAttribute<int64_t>(name); });
}

std::optional<std::string> StringAttribute(const Ort::ConstKernelInfo& info, const char* name) {
  return Optional([&] { return info.GetAttribute<std::string>(name); });
}

size_t Choice(const Ort::ConstKernelInfo& info, const char* name, const std::vector<std::string>& choices) {
  const std::string value = StringAttribute(info, name).value_or(choices[0]);
  for (size_t i = 0; i < choices.size(); ++i) {
    if (value == choices[i]) return i;
  }
  std::string allowed;
  for (const auto& choice : choices) allowed += (allowed.empty() ? "'" : ", '") + choice + "'";
  Fail("attribute '", name, "' is '", value, "', expected one of ", allowed);
}

}  // namespace sparse_lower
