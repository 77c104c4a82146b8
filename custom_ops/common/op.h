// Turns a kernel struct into an onnxruntime custom op of domain sparse_lower.
//
// A kernel struct declares
//   static constexpr const char* kName;                        the op type
//   static constexpr InputSpec kInputs[];                      input types, optional or not
//   static constexpr ONNXTensorElementDataType kOutputs[];     output types
//   static constexpr int kVariadicOutputs;                     optional: the last output type repeats,
//                                                              at least this many times
//   explicit Kernel(const Ort::ConstKernelInfo&);              reads and checks the attributes
//   void Compute(const Ort::KernelContext&) const;             the computation
//   static void InferShapes(const ShapeContext&);              output shapes where they are known
//   static constexpr const char* kProvider;                    optional: the execution provider whose
//                                                              memory and stream Compute works on (the
//                                                              CUDA kernels of cuda/device/ops.cu), by
//                                                              default onnxruntime's CPU one
// and may throw OpError anywhere: Op routes every entry point through Guard.
#pragma once

#include <algorithm>
#include <iterator>
#include <type_traits>

#include "common/shape_context.h"
#include "common/status.h"
#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

struct InputSpec {
  ONNXTensorElementDataType type;  // UNDEFINED: any element type
  bool optional;
};

constexpr auto kFloat = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
constexpr auto kInt64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
constexpr auto kInt8 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
constexpr auto kAnyType = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;

// What onnxruntime holds per node.
template <typename Kernel>
class KernelInstance {
 public:
  explicit KernelInstance(const OrtKernelInfo* info) : kernel_(Ort::ConstKernelInfo(info)) {}

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    return Guard(Kernel::kName, [&] { kernel_.Compute(Ort::KernelContext(context)); });
  }

 private:
  Kernel kernel_;
};

template <typename Kernel, typename = void>
struct VariadicOutputs : std::integral_constant<int, 0> {};
template <typename Kernel>
struct VariadicOutputs<Kernel, std::void_t<decltype(Kernel::kVariadicOutputs)>>
    : std::integral_constant<int, Kernel::kVariadicOutputs> {};

template <typename Kernel, typename = void>
struct ProviderOf {
  static constexpr const char* value = "CPUExecutionProvider";
};
template <typename Kernel>
struct ProviderOf<Kernel, std::void_t<decltype(Kernel::kProvider)>> {
  static constexpr const char* value = Kernel::kProvider;
};

template <typename Kernel>
struct Op : Ort::CustomOpBase<Op<Kernel>, KernelInstance<Kernel>, /*WithStatus=*/true> {
  Op() {
    // Set here rather than through CustomOpBase's InferOutputShape hook, so that shape inference also
    // runs inside Guard.
    this->InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* ctx) -> OrtStatusPtr {
      return Guard(Kernel::kName, [&] { Kernel::InferShapes(ShapeContext(ctx)); });
    };
  }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return Guard(Kernel::kName, [&] { *kernel = new KernelInstance<Kernel>(info); });
  }

  const char* GetName() const { return Kernel::kName; }
  const char* GetExecutionProviderType() const { return ProviderOf<Kernel>::value; }

  size_t GetInputTypeCount() const { return std::size(Kernel::kInputs); }
  ONNXTensorElementDataType GetInputType(size_t i) const { return Kernel::kInputs[i].type; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return Kernel::kInputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }

  size_t GetOutputTypeCount() const { return std::size(Kernel::kOutputs); }
  ONNXTensorElementDataType GetOutputType(size_t i) const { return Kernel::kOutputs[i]; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    const bool variadic = VariadicOutputs<Kernel>::value > 0 && i + 1 == std::size(Kernel::kOutputs);
    return variadic ? INPUT_OUTPUT_VARIADIC : INPUT_OUTPUT_REQUIRED;
  }
  int GetVariadicOutputMinArity() const { return std::max(1, VariadicOutputs<Kernel>::value); }
};

}  // namespace sparse_lower
