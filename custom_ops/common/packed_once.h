// Weights packed for a kernel once per session where they are a constant of the model.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

// Why: packing a conv's weights into the tiles' layout is a pass over K · Cin · Cout values that costs as
// much as the products on layers of few rows (a 128-channel layer of the sparse UNet: 4 ms of 6 per call,
// AMX int8). Where the weights are an initializer they are the same every call, so they are packed at the
// first call and kept; weights fed at run time are packed at each call.
template <typename Packed>
class PackedOnce {
 public:
  // `input`: the weights' input index in the node `info` describes.
  PackedOnce(const Ort::ConstKernelInfo& info, size_t input) {
    int is_constant = 0;
    info.GetTensorConstantInput(input, &is_constant);
    constant_ = is_constant != 0;
  }

  // W [taps, Cin, Cout] packed tap by tap (Packed(w_k, cin, cout)): kept from the first call where the
  // weights are constant, else packed now into `per_call`.
  template <typename T>
  const std::vector<Packed>& Get(const T* w, int64_t taps, int64_t cin, int64_t cout,
                                 std::vector<Packed>& per_call) const {
    if (!constant_) {
      per_call = Pack(w, taps, cin, cout);
      return per_call;
    }
    std::call_once(once_, [&] { kept_ = Pack(w, taps, cin, cout); });
    return kept_;
  }

 private:
  template <typename T>
  static std::vector<Packed> Pack(const T* w, int64_t taps, int64_t cin, int64_t cout) {
    std::vector<Packed> packed;
    packed.reserve(static_cast<size_t>(taps));
    for (int64_t k = 0; k < taps; ++k) packed.emplace_back(w + k * cin * cout, cin, cout);
    return packed;
  }

  bool constant_ = false;
  mutable std::once_flag once_;
  mutable std::vector<Packed> kept_;
};

}  // namespace sparse_lower
