// The kernels a library adds for an execution provider other than the CPU's: none in the CPU library
// (common/no_provider_ops.cc), the CUDA kernels in the CUDA library (cuda/device/ops.cu).
#pragma once

#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

// Adds them to the domain (which must outlive the sessions, as the CPU kernels' does).
void AddProviderOps(Ort::CustomOpDomain& domain);

}  // namespace sparse_lower
