// The CPU library (libsparse_lower_ops.so) has kernels for onnxruntime's CPU execution provider only.
#include "common/provider_ops.h"

namespace sparse_lower {

void AddProviderOps(Ort::CustomOpDomain&) {}

}  // namespace sparse_lower
