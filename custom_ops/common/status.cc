#include "common/status.h"

namespace sparse_lower {

std::string Tuple(const int64_t* values, size_t count) {
  std::string text = "(";
  for (size_t i = 0; i < count; ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + ")";
}

std::string List(const std::vector<int64_t>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

OrtStatusPtr MakeStatus(const char* op, OrtErrorCode code, const char* message) noexcept {
  const OrtApi& api = Ort::GetApi();
  try {
    return api.CreateStatus(code, (std::string(op) + ": " + message).c_str());
  } catch (...) {  // no memory left for the prefixed copy
    return api.CreateStatus(code, message);
  }
}

}  // namespace sparse_lower
