// The gpu target's ops for onnxruntime's CUDA execution provider, in libsparse_lower_cuda.so beside the
// CPU kernels. Each derives from its CPU kernel, which reads and checks the attributes, checks the input
// shapes and infers the output shapes; only Compute differs: the inputs and outputs are device memory,
// and the work runs on the provider's stream through the CUDA backend of cuda/algorithms.h.
//
// Not here, so onnxruntime runs them on the CPU (copying their inputs there): Rulebook (the gpu
// target's rulebook strategy; its default form is IndexedConv) and the index builders of the nna target.
#include <initializer_list>

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

kernels::CoordsView View(const Coords& coords) { return {coords.data, coords.rows, coords.width}; }

bodies::GridShape Shape(const Grid& grid) { return bodies::MakeGrid(static_cast<int>(grid.Dims()), grid.extent.data()); }

struct SubmanifoldMapCuda : SubmanifoldMap {
  static constexpr const char* kProvider = kCuda;
  using SubmanifoldMap::SubmanifoldMap;

  void Compute(const Ort::KernelContext& ctx) const {
    const Coords coords = ReadCoords(ctx, 0, "coords", geometry_.Dims());
    int64_t* nbr = AllocateOutput<int64_t>(ctx, 0, {coords.rows, geometry_.Taps()});
    kernels::SubmanifoldMap<Backend>(StreamOf(ctx), geometry_.Shape(), View(coords), geometry_.Dense(), nbr);
  }
};

template <typename Map>
struct ReachedMapCuda : Map {
  static constexpr const char* kProvider = kCuda;
  using Map::Map;

  void Compute(const Ort::KernelContext& ctx) const {
    const MapGeometry& geometry = this->geometry_;
    const Coords coords = ReadCoords(ctx, 0, "coords", geometry.Dims());
    const cudaStream_t stream = StreamOf(ctx);
    kernels::ReachedSites<Backend> reached(stream, geometry.Shape(), View(coords));
    const int64_t count = reached.Count();
    int64_t* out_coords = AllocateOutput<int64_t>(ctx, 0, {count, coords.width});
    int64_t* nbr = AllocateOutput<int64_t>(ctx, 1, {count, geometry.Taps()});
    reached.Write(stream, geometry.Dense(), out_coords, nbr);
  }
};

struct TargetMapCuda : TargetMap {
  static constexpr const char* kProvider = kCuda;
  using TargetMap::TargetMap;

  void Compute(const Ort::KernelContext& ctx) const {
    const Coords coords = ReadCoords(ctx, 0, "coords", geometry_.Dims());
    const Coords targets = ReadCoords(ctx, 1, "target_coords", geometry_.Dims());
    int64_t* nbr = AllocateOutput<int64_t>(ctx, 0, {targets.rows, geometry_.Taps()});
    kernels::TargetMap<Backend>(StreamOf(ctx), geometry_.Shape(), View(coords), View(targets), geometry_.Dense(), nbr);
  }
};

struct SiteIndexCuda : SiteIndex {
  static constexpr const char* kProvider = kCuda;
  using SiteIndex::SiteIndex;

  void Compute(const Ort::KernelContext& ctx) const {
    const Coords coords = ReadCoords(ctx, 0, "coords", grid_.Dims());
    int64_t* sites = AllocateOutput<int64_t>(ctx, 0, {coords.rows});
    kernels::SiteIndex<Backend>(StreamOf(ctx), Shape(grid_), batch_size_, View(coords), sites);
  }
};

struct ActiveSitesCuda : ActiveSites {
  static constexpr const char* kProvider = kCuda;
  using ActiveSites::ActiveSites;

  void Compute(const Ort::KernelContext& ctx) const {
    const DenseInput in = Read(ctx);
    const cudaStream_t stream = StreamOf(ctx);
    kernels::ActiveSites<Backend> active(stream, in.x.data, in.batch, in.channels, Shape(in.grid));
    const int64_t count = active.Count();
    int64_t* coords = AllocateOutput<int64_t>(ctx, 0, {count, static_cast<int64_t>(1 + in.grid.Dims())});
    int64_t* sites = AllocateOutput<int64_t>(ctx, 1, {count, 1});
    active.Write(stream, coords, sites);
  }
};

struct CoalesceMapCuda : CoalesceMap {
  static constexpr const char* kProvider = kCuda;
  using CoalesceMap::CoalesceMap;

  void Compute(const Ort::KernelContext& ctx) const {
    const Coords coords = ReadCoords(ctx, 0, "coords", grid_.Dims());
    const cudaStream_t stream = StreamOf(ctx);
    kernels::CoalescedSites<Backend> coalesced(stream, Shape(grid_), View(coords), members_);
    int64_t* out_coords = AllocateOutput<int64_t>(ctx, 0, {coalesced.Count(), coords.width});
    int64_t* members = AllocateOutput<int64_t>(ctx, 1, {coalesced.Count(), coalesced.Width()});
    coalesced.Write(stream, out_coords, members);
  }
};

struct IndexedUnfoldCuda : IndexedUnfold {
  static constexpr const char* kProvider = kCuda;
  using IndexedUnfold::IndexedUnfold;

  void Compute(const Ort::KernelContext& ctx) const {
    const Inputs in = Read(ctx);
    float* y = AllocateOutput<float>(ctx, 0, in.y_shape);
    kernels::Unfold<Backend>(StreamOf(ctx), in.x.data, in.limit, in.channels, in.dense, in.volume, in.idx.data, in.rows,
                             in.taps, y);
  }
};

struct IndexedFoldCuda : IndexedFold {
  static constexpr const char* kProvider = kCuda;
  using IndexedFold::IndexedFold;

  void Compute(const Ort::KernelContext& ctx) const {
    const Inputs in = Read(ctx);
    float* y = AllocateOutput<float>(ctx, 0, in.y_shape);
    kernels::Fold<Backend>(StreamOf(ctx), in.rows.data, in.idx.data, in.idx.Size(), in.channels, in.targets,
                           grid_.has_value(), grid_ ? grid_->volume : 1, in.init, in.init_rows, y);
  }
};

struct IndexedConvCuda : IndexedConv {
  static constexpr const char* kProvider = kCuda;
  using IndexedConv::IndexedConv;

  void Compute(const Ort::KernelContext& ctx) const {
    const Inputs in = Read(ctx);
    const ConvShapes& s = in.shapes;
    float* y = AllocateOutput<float>(ctx, 0, {s.rows, s.cout});
    const bodies::ConvArgs args{in.x.data, s.inputs, s.cin, in.idx.data, s.rows, s.taps, in.w.data, s.cout,
                                in.bias,   in.residual, relu_ ? 1 : 0, y};
    kernels::Conv<Backend>(StreamOf(ctx), args, /*half=*/false);
  }
};

struct IndexedConvInt8Cuda : IndexedConvInt8 {
  static constexpr const char* kProvider = kCuda;
  using IndexedConvInt8::IndexedConvInt8;

  void Compute(const Ort::KernelContext& ctx) const {
    const Inputs in = Read(ctx);
    const ConvShapes& s = in.shapes;
    float* y = AllocateOutput<float>(ctx, 0, {s.rows, s.cout});
    const bodies::ConvArgs args{in.x.data, s.inputs, s.cin, in.idx.data, s.rows, s.taps, nullptr, s.cout,
                                in.bias,   in.residual, relu_ ? 1 : 0, y};
    kernels::ConvInt8<Backend>(StreamOf(ctx), args, in.w.data, in.x_scale.data, in.w_scale.data);
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
  static const Op<CoalesceMapCuda> coalesce_map;
  static const Op<IndexedUnfoldCuda> indexed_unfold;
  static const Op<IndexedFoldCuda> indexed_fold;
  static const Op<IndexedConvCuda> indexed_conv;
  static const Op<IndexedConvInt8Cuda> indexed_conv_int8;
  for (const OrtCustomOp* op : std::initializer_list<const OrtCustomOp*>{
           &active_sites, &submanifold_map, &strided_map, &transposed_map, &target_map, &site_index, &coalesce_map, &indexed_unfold,
           &indexed_fold, &indexed_conv, &indexed_conv_int8}) {
    domain.Add(op);
  }
}

}  // namespace sparse_lower
