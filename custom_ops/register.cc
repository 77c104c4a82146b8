// The library's one exported symbol: onnxruntime calls RegisterCustomOps when a session loads the
// library (SessionOptions.register_custom_ops_library) and passes its API in, so the library links
// against nothing of onnxruntime. Every library registers the CPU kernels; the CUDA library
// (libsparse_lower_cuda.so) adds its kernels for onnxruntime's CUDA execution provider (AddProviderOps).
#include <initializer_list>
#include <mutex>
#include <string>
#include <vector>

#include "common/op.h"
#include "common/provider_ops.h"
#include "conv/indexed_conv.h"
#include "conv/indexed_conv_int8.h"
#include "fold/indexed_fold.h"
#include "index/active_sites.h"
#include "index/capacity_pads.h"
#include "index/coalesce_map.h"
#include "index/inverse_map.h"
#include "index/pair_lists.h"
#include "index/pair_rows.h"
#include "index/rulebook.h"
#include "index/scatter_matrices.h"
#include "index/site_index.h"
#include "index/site_order.h"
#include "index/strided_map.h"
#include "index/submanifold_map.h"
#include "index/target_map.h"
#include "index/transposed_map.h"
#include "unfold/indexed_unfold.h"

namespace sparse_lower {
namespace {

constexpr const char* kDomain = "sparse_lower";

// A domain must outlive every session that uses it, so each one is kept until the library unloads.
void Keep(Ort::CustomOpDomain&& domain) {
  static std::mutex mutex;
  static std::vector<Ort::CustomOpDomain> domains;
  std::lock_guard<std::mutex> lock(mutex);
  domains.push_back(std::move(domain));
}

}  // namespace
}  // namespace sparse_lower

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  using namespace sparse_lower;
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {  // an onnxruntime older than the headers; version 1 of the API exists in all
    const std::string message = std::string(kDomain) + ": this library needs onnxruntime API version " +
                                std::to_string(ORT_API_VERSION) + " or later, onnxruntime " +
                                api_base->GetVersionString() + " is older";
    return api_base->GetApi(1)->CreateStatus(ORT_FAIL, message.c_str());
  }
  Ort::InitApi(api);
  return Guard(kDomain, [&] {
    static const Op<ActiveSites> active_sites;
    static const Op<SubmanifoldMap> submanifold_map;
    static const Op<StridedMap> strided_map;
    static const Op<TransposedMap> transposed_map;
    static const Op<TargetMap> target_map;
    static const Op<Rulebook> rulebook;
    static const Op<SiteIndex> site_index;
    static const Op<IndexedUnfold> indexed_unfold;
    static const Op<IndexedFold> indexed_fold;
    static const Op<IndexedConv> indexed_conv;
    static const Op<IndexedConvInt8> indexed_conv_int8;
    static const Op<InverseMap> inverse_map;
    static const Op<ScatterMatrices> scatter_matrices;
    static const Op<CapacityPads> capacity_pads;
    static const Op<PairRows> pair_rows;
    static const Op<PairLists> pair_lists;
    static const Op<CoalesceMap> coalesce_map;
    static const Op<SiteOrder> site_order;
    Ort::CustomOpDomain domain(kDomain);
    for (const OrtCustomOp* op : std::initializer_list<const OrtCustomOp*>{
             &active_sites, &submanifold_map, &strided_map, &transposed_map, &target_map, &rulebook, &site_index,
             &indexed_unfold, &indexed_fold, &indexed_conv, &indexed_conv_int8, &inverse_map, &scatter_matrices,
             &capacity_pads, &pair_rows, &pair_lists, &coalesce_map, &site_order}) {
      domain.Add(op);
    }
    AddProviderOps(domain);
    Ort::UnownedSessionOptions(options).Add(domain);
    Keep(std::move(domain));
  });
}
