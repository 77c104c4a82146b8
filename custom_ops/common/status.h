// Errors inside the library, and their conversion to onnxruntime statuses at the C boundary.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

// An invalid input or attribute. Code below a kernel's entry points throws it; Guard turns it into
// an INVALID_ARGUMENT status whose message starts with the op name.
class OpError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Parts>
[[noreturn]] void Fail(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw OpError(message.str());
}

// How coordinates ("(0, 5, 3)") and shapes ("[4, 4]") appear in messages.
std::string Tuple(const int64_t* values, size_t count);
std::string List(const std::vector<int64_t>& values);

// A status "<op>: <message>".
OrtStatusPtr MakeStatus(const char* op, OrtErrorCode code, const char* message) noexcept;

// Runs f and returns what it threw as a status naming the op. Every entry point onnxruntime calls goes
// through Guard, because an exception must never unwind through onnxruntime's C interface.
template <typename F>
OrtStatusPtr Guard(const char* op, F&& f) noexcept {
  try {
    f();
    return nullptr;
  } catch (const OpError& e) {
    return MakeStatus(op, ORT_INVALID_ARGUMENT, e.what());
  } catch (const Ort::Exception& e) {
    return MakeStatus(op, e.GetOrtErrorCode(), e.what());
  } catch (const std::bad_alloc&) {
    return MakeStatus(op, ORT_RUNTIME_EXCEPTION, "out of memory");
  } catch (const std::exception& e) {
    return MakeStatus(op, ORT_RUNTIME_EXCEPTION, e.what());
  } catch (...) {
    return MakeStatus(op, ORT_RUNTIME_EXCEPTION, "unknown error");
  }
}

}  // namespace sparse_lower
