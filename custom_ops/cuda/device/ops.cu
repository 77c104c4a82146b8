// The gpu target's ops for onnxruntime's CUDA execution provider, in libsparse_lower_cuda.so beside the
// CPU kernels. Each derives from its CPU kernel, which reads and checks the attributes, checks the input
// shapes and infers the output shapes; only Compute differs: the inputs and outputs are device memory,
// and the work runs on the provider's stream through the CUDA backend of cuda/algorithms.h. Each names
// its node to the stream's checks (cuda/checks.h), for a deferred report to say which op refused what.
//
// Not here, so onnxruntime runs them on the CPU (copying their inputs there): Rulebook (the gpu
// target's rulebook strategy; its default form is IndexedConv) and the index builders of the nna target.
#include <initializer_list>
#include <string>

#include "common/op.h"
#include "common/provider_ops.h"
#include "common/tensor.h"
#include "conv/conv_rows.h"
#include "conv/indexed_conv.h"
#include "conv/indexed_conv_int8.h"
#include "cuda/algorithms.h"
#include "cuda/device/cuda_backend.h"
#include "fold/indexed_fold.h"
#include "index/active_sites.h"
#include "index/coalesce_map.h"
#include "index/site_index.h"
#include "index/site_order.h"
#include "index/strided_map.h"
#include "index/submanifold_map.h"
#include "index/target_map.h"
#include "index/transposed_map.h"
#include "unfold/indexed_unfold.h"

namespace sparse_lower {
namespace {

using Backend = CudaBackend;
constexpr const char* kCuda = "CUDAExecutionProvider";

cudaStream_t StreamOf(const Ort::KernelContext& ctx) { return static_cast<cudaStream_t>(ctx.GetGPUComputeStream()); }

// A CPU kernel with its node's name, which Begin gives the stream's checks.
template <typename Kernel>
struct Named : Kernel {
  explicit Named(const Ort::ConstKernelInfo& info)
      : Kernel(info), label_(std::string(Kernel::kName) + " node '" + info.GetNodeName() + "'") {}

  // The stream of this Compute, its checks told which op follows.
  cudaStream_t Begin(const Ort::KernelContext& ctx) const {
    const cudaStream_t stream = StreamOf(ctx);
    kernels::Checks<Backend>::Of(stream).Within(label_);
    return stream;
  }

 private:
  std::string label_;
};

kernels::CoordsView View(const Coords& coords) { return {coords.data, coords.rows, coords.width}; }

bodies::GridShape Shape(const Grid& grid) { return bodies::MakeGrid(static_cast<int>(grid.Dims()), grid.extent.data()); }

struct SubmanifoldMapCuda : Named<SubmanifoldMap> {
  static constexpr const char* kProvider = kCuda;
  using Named<SubmanifoldMap>::Named;

  void Compute(const Ort::KernelContext& ctx) const {
    const Coords coords = ReadCoords(ctx, 0, "coords", geometry_.Dims());
    int64_t* nbr = AllocateOutput<int64_t>(ctx, 0, {coords.rows, geometry_.Taps()});
    kernels::SubmanifoldMap<Backend>(this->Begin(ctx), geometry_.Shape(), View(coords), geometry_.Dense(), nbr);
  }
};

template <typename Map>
struct ReachedMapCuda : Named<Map> {
  static constexpr const char* kProvider = kCuda;
  using Named<Map>::Named;

  void Compute(const Ort::KernelContext& ctx) const {
    const MapGeometry& geometry = this->geometry_;
    const Coords coords = ReadCoords(ctx, 0, "coords", geometry.Dims());
    const cudaStream_t stream = this->Begin(ctx);
    kernels::ReachedSites<Backend> reached(stream, geometry.Shape(), View(coords));
    const int64_t count = reached.Count();
    int64_t* out_coords = AllocateOutput<int64_t>(ctx, 0, {count, coords.width});
    int64_t* nbr = AllocateOutput<int64_t>(ctx, 1, {count, geometry.Taps()});
    reached.Write(stream, geometry.Dense(), out_coords, nbr);
  }
};

struct TargetMapCuda : Named<TargetMap> {
  static constexpr const char* kProvider = kCuda;
  using Named<TargetMap>::Named;

  void Compute(const Ort::KernelContext& ctx) const {
    const Coords coords = ReadCoords(ctx, 0, "coords", geometry_.Dims());
    const Coords targets = ReadCoords(ctx, 1, "target_coords", geometry_.Dims());
    int64_t* nbr = AllocateOutput<int64_t>(ctx, 0, {targets.rows, geometry_.Taps()});
    kernels::TargetMap<Backend>(this->Begin(ctx), geometry_.Shape(), View(coords), View(targets), geometry_.Dense(), nbr);
  }
};

struct SiteIndexCuda : Named<SiteIndex> {
  static constexpr const char* kProvider = kCuda;
  using Named<SiteIndex>::Named;

  void Compute(const Ort::KernelContext& ctx) const {
    const Coords coords = ReadCoords(ctx, 0, "coords", grid_.Dims());
    int64_t* sites = AllocateOutput<int64_t>(ctx, 0, {coords.rows});
    kernels::SiteIndex<Backend>(this->Begin(ctx), Shape(grid_), batch_size_, View(coords), sites);
  }
};

struct SiteOrderCuda : Named<SiteOrder> {
  static constexpr const char* kProvider = kCuda;
  using Named<SiteOrder>::Named;

  void Compute(const Ort::KernelContext& ctx) const {
    const Coords coords = ReadCoords(ctx, 0, "coords", grid_.Dims());
    int64_t* out_coords = AllocateOutput<int64_t>(ctx, 0, {coords.rows, coords.width});
    int64_t* order = AllocateOutput<int64_t>(ctx, 1, {coords.rows, 1});
    int64_t* rank = AllocateOutput<int64_t>(ctx, 2, {coords.rows, 1});
    kernels::SiteOrder<Backend>(this->Begin(ctx), Shape(grid_), View(coords), out_coords, order, rank);
  }
};

struct ActiveSitesCuda : Named<ActiveSites> {
  static constexpr const char* kProvider = kCuda;
  using Named<ActiveSites>::Named;

  void Compute(const Ort::KernelContext& ctx) const {
    const DenseInput in = Read(ctx);
    const cudaStream_t stream = this->Begin(ctx);
    kernels::ActiveSites<Backend> active(stream, in.x.data, in.batch, in.channels, Shape(in.grid));
    const int64_t count = active.Count();
    int64_t* coords = AllocateOutput<int64_t>(ctx, 0, {count, static_cast<int64_t>(1 + in.grid.Dims())});
    int64_t* sites = AllocateOutput<int64_t>(ctx, 1, {count, 1});
    active.Write(stream, coords, sites);
  }
};

struct CoalesceMapCuda : Named<CoalesceMap> {
  static constexpr const char* kProvider = kCuda;
  using Named<CoalesceMap>::Named;

  void Compute(const Ort::KernelContext& ctx) const {
    const Coords coords = ReadCoords(ctx, 0, "coords", grid_.Dims());
    const cudaStream_t stream = this->Begin(ctx);
    kernels::CoalescedSites<Backend> coalesced(stream, Shape(grid_), View(coords), members_);
    int64_t* out_coords = AllocateOutput<int64_t>(ctx, 0, {coalesced.Count(), coords.width});
    int64_t* members = AllocateOutput<int64_t>(ctx, 1, {coalesced.Count(), coalesced.Width()});
    coalesced.Write(stream, out_coords, members);
  }
};

struct IndexedUnfoldCuda : Named<IndexedUnfold> {
  static constexpr const char* kProvider = kCuda;
  using Named<IndexedUnfold>::Named;

  void Compute(const Ort::KernelContext& ctx) const {
    const Inputs in = Read(ctx);
    float* y = AllocateOutput<float>(ctx, 0, in.y_shape);
    kernels::Unfold<Backend>(this->Begin(ctx), in.x.data, in.limit, in.channels, in.dense, in.volume, in.idx.data, in.rows,
                             in.taps, y);
  }
};

struct IndexedFoldCuda : Named<IndexedFold> {
  static constexpr const char* kProvider = kCuda;
  using Named<IndexedFold>::Named;

  void Compute(const Ort::KernelContext& ctx) const {
    const Inputs in = Read(ctx);
    float* y = AllocateOutput<float>(ctx, 0, in.y_shape);
    kernels::Fold<Backend>(this->Begin(ctx), in.rows.data, in.idx.data, in.idx.Size(), in.channels, in.targets,
                           grid_.has_value(), grid_ ? grid_->volume : 1, in.init, in.init_rows, y);
  }
};

struct IndexedConvCuda : Named<IndexedConv> {
  static constexpr const char* kProvider = kCuda;
  using Named<IndexedConv>::Named;

  void Compute(const Ort::KernelContext& ctx) const {
    const Inputs in = Read(ctx);
    const ConvShapes& s = in.shapes;
    float* y = AllocateOutput<float>(ctx, 0, {s.rows, s.cout});
    const bodies::ConvArgs args{in.x.data, s.inputs, s.cin, in.idx.data, s.rows, s.taps, in.w.data, s.cout,
                                in.bias,   in.residual, relu_ ? 1 : 0, y};
    kernels::Conv<Backend>(this->Begin(ctx), args, bf16_ ? bodies::Products::kBfloat16 : bodies::Products::kFloat32);
  }
};

struct IndexedConvInt8Cuda : Named<IndexedConvInt8> {
  static constexpr const char* kProvider = kCuda;
  using Named<IndexedConvInt8>::Named;

  void Compute(const Ort::KernelContext& ctx) const {
    const Inputs in = Read(ctx);
    const ConvShapes& s = in.shapes;
    float* y = AllocateOutput<float>(ctx, 0, {s.rows, s.cout});
    const bodies::ConvArgs args{in.x.data, s.inputs, s.cin, in.idx.data, s.rows, s.taps, nullptr, s.cout,
                                in.bias,   in.residual, relu_ ? 1 : 0, y};
    kernels::ConvInt8<Backend>(this->Begin(ctx), args, in.w.data, in.x_scale.data, in.w_scale.data);
  }
};

}  // namespace

void AddProviderOps(Ort::CustomOpDomain& domain) {
  static const Op<ActiveSitesCuda> active_sites;
  static const Op<SubmanifoldMapCuda> submanifold_map;
  static const Op<ReachedMapCuda<StridedMap>> strided_map;
  static const Op<ReachedMapCuda<TransposedMap>> transposed_map;
  static const Op<TargetMapCuda> target_map;
  static const Op<SiteIndexCuda> site_index;
  static const Op<SiteOrderCuda> site_order;
  static const Op<CoalesceMapCuda> coalesce_map;
  static const Op<IndexedUnfoldCuda> indexed_unfold;
  static const Op<IndexedFoldCuda> indexed_fold;
  static const Op<IndexedConvCuda> indexed_conv;
  static const Op<IndexedConvInt8Cuda> indexed_conv_int8;
  for (const OrtCustomOp* op : std::initializer_list<const OrtCustomOp*>{
           &active_sites, &submanifold_map, &strided_map, &transposed_map, &target_map, &site_index, &coalesce_map, &indexed_unfold,
           &indexed_fold, &indexed_conv, &indexed_conv_int8, &site_order}) {
    domain.Add(op);
  }
}

}  // namespace sparse_lower
