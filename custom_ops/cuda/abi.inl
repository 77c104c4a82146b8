// The C ABI (cuda/abi.h) over the algorithms of one backend: included by cuda/device/abi.cu with
// `Backend` = CudaBackend and by cuda/emulated/abi.cc with `Backend` = HostBackend, so that both
// libraries check and compute alike. Each entry point turns what the algorithms throw into the message.
#include <cstring>
#include <exception>
#include <limits>
#include <string>

#include "cuda/abi.h"
#include "cuda/algorithms.h"

namespace sparse_lower {
namespace {

using kernels::CoordsView;

typename Backend::Stream StreamOf(void* stream) { return reinterpret_cast<typename Backend::Stream>(stream); }

// Runs f; on an error, its message into error[error_size] and 1.
template <typename F>
int Guarded(char* error, int64_t error_size, F&& f) noexcept {
  std::string message;
  try {
    return f();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown error";
  }
  if (error != nullptr && error_size > 0) {
    const size_t length = std::min(message.size(), static_cast<size_t>(error_size - 1));
    std::memcpy(error, message.data(), length);
    error[length] = '\0';
  }
  return 1;
}

// The grid of `dims` extents, refused unless 1 to 3 extents ≥ 1 whose volume fits in int64.
bodies::GridShape CheckedGrid(int32_t dims, const int64_t* extent) {
  if (dims < 1 || dims > bodies::kMaxDims) Fail("a grid has 1 to 3 dimensions, got ", dims);
  int64_t volume = 1;
  for (int32_t d = 0; d < dims; ++d) {
    if (extent[d] < 1 || __builtin_mul_overflow(volume, extent[d], &volume)) {
      Fail("the grid ", List({extent, extent + dims}), " has an extent below 1 or more sites than int64 numbers");
    }
  }
  return bodies::MakeGrid(dims, extent);
}

const bodies::MapShape& CheckedMap(const SlMapShape* map) {
  if (map == nullptr) Fail("no geometry given");
  int64_t in[bodies::kMaxDims], out[bodies::kMaxDims];
  for (int32_t d = 0; d < map->dims && d < bodies::kMaxDims; ++d) {
    const SlAxis& a = map->axis[d];
    if (a.kernel < 1 || a.stride < 1 || a.dilation < 1 || a.pad < 0) Fail("axis ", d, " has an invalid kernel geometry");
    in[d] = a.in_extent;
    out[d] = a.out_extent;
  }
  CheckedGrid(map->dims, in);
  CheckedGrid(map->dims, out);
  return *map;
}

int Counted(int64_t found, int64_t capacity, int64_t* count) {
  *count = found;
  return found > capacity ? 2 : 0;
}

}  // namespace
}  // namespace sparse_lower

using namespace sparse_lower;

const char* sl_backend(void) { return Backend::kName; }

int sl_defer_checks(void* stream, int32_t on) {
  return Guarded(nullptr, 0, [&] {
    kernels::Checks<Backend>::Of(StreamOf(stream)).Defer(on != 0);
    return 0;
  });
}

int sl_new_stream(int32_t device, void** stream, char* error, int64_t error_size) {
  return Guarded(error, error_size, [&] {
    *stream = reinterpret_cast<void*>(Backend::NewStream(device));
    return 0;
  });
}

int sl_report(void* stream, char* error, int64_t error_size) {
  return Guarded(error, error_size, [&] {
    kernels::Checks<Backend>::Of(StreamOf(stream)).Report(StreamOf(stream));
    return 0;
  });
}

int sl_submanifold_map(void* stream, const SlMapShape* map, const int64_t* coords, int64_t rows, int32_t dense,
                       int64_t* nbr, char* error, int64_t error_size) {
  return Guarded(error, error_size, [&] {
    const bodies::MapShape& shape = CheckedMap(map);
    kernels::SubmanifoldMap<Backend>(StreamOf(stream), shape, CoordsView{coords, rows, 1 + shape.dims}, dense != 0, nbr);
    return 0;
  });
}

int sl_reached_map(void* stream, const SlMapShape* map, const int64_t* coords, int64_t rows, int32_t dense,
                   int64_t capacity, int64_t* count, int64_t* out_coords, int64_t* nbr, char* error,
                   int64_t error_size) {
  return Guarded(error, error_size, [&] {
    const bodies::MapShape& shape = CheckedMap(map);
    kernels::ReachedSites<Backend> reached(StreamOf(stream), shape, CoordsView{coords, rows, 1 + shape.dims});
    if (Counted(reached.Count(), capacity, count)) return 2;
    reached.Write(StreamOf(stream), dense != 0, out_coords, nbr);
    return 0;
  });
}

int sl_target_map(void* stream, const SlMapShape* map, const int64_t* coords, int64_t rows, const int64_t* targets,
                  int64_t target_rows, int32_t dense, int64_t* nbr, char* error, int64_t error_size) {
  return Guarded(error, error_size, [&] {
    const bodies::MapShape& shape = CheckedMap(map);
    kernels::TargetMap<Backend>(StreamOf(stream), shape, CoordsView{coords, rows, 1 + shape.dims},
                                CoordsView{targets, target_rows, 1 + shape.dims}, dense != 0, nbr);
    return 0;
  });
}

int sl_site_index(void* stream, int32_t dims, const int64_t* extent, int64_t batch_size, const int64_t* coords,
                  int64_t rows, int64_t* sites, char* error, int64_t error_size) {
  return Guarded(error, error_size, [&] {
    const bodies::GridShape grid = CheckedGrid(dims, extent);
    if (batch_size < 1 || batch_size - 1 > kernels::MaxBatch(grid)) Fail("batch_size ", batch_size, " is out of range");
    kernels::SiteIndex<Backend>(StreamOf(stream), grid, batch_size, CoordsView{coords, rows, 1 + dims}, sites);
    return 0;
  });
}

int sl_site_order(void* stream, int32_t dims, const int64_t* extent, const int64_t* coords, int64_t rows,
                  int64_t* out_coords, int64_t* order, int64_t* rank, char* error, int64_t error_size) {
  return Guarded(error, error_size, [&] {
    const bodies::GridShape grid = CheckedGrid(dims, extent);
    kernels::SiteOrder<Backend>(StreamOf(stream), grid, CoordsView{coords, rows, 1 + dims}, out_coords, order, rank);
    return 0;
  });
}

int sl_active_sites(void* stream, const float* x, int64_t batch, int64_t channels, int32_t dims, const int64_t* extent,
                    int64_t capacity, int64_t* count, int64_t* coords, int64_t* sites, char* error,
                    int64_t error_size) {
  return Guarded(error, error_size, [&] {
    const bodies::GridShape grid = CheckedGrid(dims, extent);
    int64_t total = 0;
    if (batch < 0 || channels < 0 || __builtin_mul_overflow(batch, grid.volume, &total)) {
      Fail("X of batch ", batch, " has too many sites");
    }
    kernels::ActiveSites<Backend> active(StreamOf(stream), x, batch, channels, grid);
    if (Counted(active.Count(), capacity, count)) return 2;
    active.Write(StreamOf(stream), coords, sites);
    return 0;
  });
}

int sl_coalesce_map(void* stream, int32_t dims, const int64_t* extent, const int64_t* coords, int64_t rows,
                    int64_t members, int64_t capacity, int64_t* count, int64_t* width, int64_t* out_coords,
                    int64_t* table, char* error, int64_t error_size) {
  return Guarded(error, error_size, [&] {
    const bodies::GridShape grid = CheckedGrid(dims, extent);
    if (members < 0) Fail("members = ", members, " must be at least 0");
    kernels::CoalescedSites<Backend> coalesced(StreamOf(stream), grid, CoordsView{coords, rows, 1 + dims}, members);
    const int64_t allocated = *width;
    *width = coalesced.Width();
    if (Counted(coalesced.Count(), capacity, count) || coalesced.Width() != allocated) return 2;
    coalesced.Write(StreamOf(stream), out_coords, table);
    return 0;
  });
}

int sl_unfold(void* stream, const float* x, int64_t limit, int64_t channels, int32_t dense, int64_t volume,
              const int64_t* idx, int64_t rows, int64_t taps, float* y, char* error, int64_t error_size) {
  return Guarded(error, error_size, [&] {
    kernels::Unfold<Backend>(StreamOf(stream), x, limit, channels, dense != 0, dense ? volume : 1, idx, rows, taps, y);
    return 0;
  });
}

int sl_fold(void* stream, const float* rows, const int64_t* idx, int64_t count, int64_t channels, int64_t targets,
            int32_t dense, int64_t volume, const float* init, int32_t init_rows, float* y, char* error,
            int64_t error_size) {
  return Guarded(error, error_size, [&] {
    if (dense && init != nullptr) Fail("init is for mode 'rows'");
    kernels::Fold<Backend>(StreamOf(stream), rows, idx, count, channels, targets, dense != 0, dense ? volume : 1, init,
                           init_rows != 0, y);
    return 0;
  });
}

int sl_indexed_conv(void* stream, const float* x, int64_t inputs, int64_t cin, const int64_t* idx, int64_t rows,
                    int64_t taps, const float* w, int64_t cout, const float* bias, const float* residual, int32_t relu,
                    int32_t half, int32_t splits, float* y, char* error, int64_t error_size) {
  return Guarded(error, error_size, [&] {
    if (splits < 0) Fail("splits = ", splits, " must be at least 0");
    if (half < 0 || half > 2) Fail("half = ", half, " must be 0 (float32), 1 (float16) or 2 (bfloat16)");
    const bodies::ConvArgs args{x, inputs, cin, idx, rows, taps, w, cout, bias, residual, relu, y};
    kernels::Conv<Backend>(StreamOf(stream), args, static_cast<bodies::Products>(half), splits);
    return 0;
  });
}

int sl_indexed_conv_int8(void* stream, const float* x, int64_t inputs, int64_t cin, const int64_t* idx, int64_t rows,
                         int64_t taps, const int8_t* w, int64_t cout, const float* x_scale, const float* w_scale,
                         const float* bias, const float* residual, int32_t relu, float* y, char* error,
                         int64_t error_size) {
  return Guarded(error, error_size, [&] {
    const bodies::ConvArgs args{x, inputs, cin, idx, rows, taps, nullptr, cout, bias, residual, relu, y};
    kernels::ConvInt8<Backend>(StreamOf(stream), args, w, x_scale, w_scale);
    return 0;
  });
}
