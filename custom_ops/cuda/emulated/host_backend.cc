#include "cuda/emulated/host_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

namespace sparse_lower {
namespace {

using namespace bodies;

// IEEE half precision. GCC before 13 has no _Float16 in C++ on aarch64; ARM's __fp16 is the same format
// with the same conversions there.
#if defined(__aarch64__)
using Half = __fp16;
#else
using Half = _Float16;
#endif

// A half-precision value as float: the nearest half, ties to even (as the GPU's conversion).
float ToHalf(float v) { return static_cast<float>(static_cast<Half>(v)); }

// A bfloat16 value as float: the nearest, ties to even (as the GPU's __float2bfloat16_rn); NaN stays NaN.
float ToBfloat16(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return v;
  bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// The tap loop of block z of a tile, as cuda/device/cuda_backend.cu launches it: phases 1–2 list the
// tap's inputs, and only a tap that some row has is multiplied, slice by slice. `slice(k, c0)` runs
// phases 3 and 4 for every thread of the block.
template <typename Slice>
void TapLoop(const ConvArgs& a, int z, int64_t first_row, int threads, Slice slice) {
  TileSources sources;
  for (int64_t k = TapsBegin(a, z); k < TapsEnd(a, z); ++k) {
    ClearSources(sources);
    for (int t = 0; t < threads; ++t) ListSource(a, first_row, k, t, sources);
    if (!sources.any) continue;
    for (int64_t c0 = 0; c0 < a.cin; c0 += kTileDepth) slice(sources, k, c0);
  }
}

int64_t Tiles(int64_t count, int size) { return (count + size - 1) / size; }

}  // namespace

int HostBackend::Multiprocessors(Stream) { return kEmulatedMultiprocessors; }

int64_t HostBackend::SortUnique(Stream, int64_t* data, int64_t count) {
  std::sort(data, data + count);
  return std::unique(data, data + count) - data;
}

void HostBackend::StableSortByKey(Stream, int64_t* keys, int64_t* values, int64_t count) {
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
  std::vector<int64_t> k(order.size()), v(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    k[i] = keys[order[i]];
    v[i] = values[order[i]];
  }
  std::copy(k.begin(), k.end(), keys);
  std::copy(v.begin(), v.end(), values);
}

int64_t HostBackend::Select(Stream, const uint8_t* flags, int64_t count, int64_t* out) {
  int64_t found = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (flags[i]) out[found++] = i;
  }
  return found;
}

namespace {

template <typename T>
void FloatTiles(const ConvArgs& a) {
  std::vector<FloatAccumulators> acc(T::kFloatThreads);
  FloatSlice<T> slice;
  for (int z = 0; z < a.splits; ++z) {
    for (int64_t row_tile = 0; row_tile < Tiles(a.rows, kTileRows); ++row_tile) {
      for (int64_t col_tile = 0; col_tile < Tiles(a.cout, T::kCols); ++col_tile) {
        const int64_t first_row = row_tile * kTileRows, first_col = col_tile * T::kCols;
        for (int t = 0; t < T::kFloatThreads; ++t) StartFloat<T>(a, first_col, t, acc[t]);
        TapLoop(a, z, first_row, T::kFloatThreads, [&](const TileSources& sources, int64_t k, int64_t c0) {
          for (int t = 0; t < T::kFloatThreads; ++t) LoadFloatSlice(a, sources, k, c0, first_col, t, slice);
          for (int t = 0; t < T::kFloatThreads; ++t) MultiplyFloatSlice(slice, t, acc[t]);
        });
        for (int t = 0; t < T::kFloatThreads; ++t) StoreFloat<T>(a, z, first_row, first_col, t, acc[t]);
      }
    }
  }
}

template <typename T>
void HalfTiles(const ConvArgs& a, float (*round)(float)) {
  std::vector<float> x(kTileRows * kHalfSliceLead), w(kTileDepth * T::kWeightLead), tile(kTileRows * T::kLead);
  for (int z = 0; z < a.splits; ++z) {
    for (int64_t row_tile = 0; row_tile < Tiles(a.rows, kTileRows); ++row_tile) {
      for (int64_t col_tile = 0; col_tile < Tiles(a.cout, T::kCols); ++col_tile) {
        const int64_t first_row = row_tile * kTileRows, first_col = col_tile * T::kCols;
        std::fill(tile.begin(), tile.end(), 0.0f);  // the fragments start at zero; the bias comes last
        TapLoop(a, z, first_row, T::kHalfThreads, [&](const TileSources& sources, int64_t k, int64_t c0) {
          for (int t = 0; t < T::kHalfThreads; ++t) {
            LoadHalfSlice<T>(a, sources, k, c0, first_col, t, x.data(), w.data(), round);
          }
          // Each warp's block: what its 16 × 16 tensor-core products add, in float32.
          for (int warp = 0; warp < T::kHalfWarps; ++warp) {
            const int r0 = WarpRow<T>(warp), n0 = WarpCol<T>(warp);
            for (int r = r0; r < r0 + kWarpTile; ++r) {
              for (int n = n0; n < n0 + T::kWarpCols; ++n) {
                float sum = 0.0f;
                for (int cc = 0; cc < kTileDepth; ++cc) sum += x[r * kHalfSliceLead + cc] * w[cc * T::kWeightLead + n];
                tile[r * T::kLead + n] += sum;
              }
            }
          }
        });
        for (int t = 0; t < T::kHalfThreads; ++t) StoreHalf<T>(a, z, first_row, first_col, t, tile.data());
      }
    }
  }
}

}  // namespace

void HostBackend::ConvFloat(Stream, const ConvArgs& a) {
  WithTile(a.cout, [&](auto tile) { FloatTiles<decltype(tile)>(a); });
}

void HostBackend::ConvHalf(Stream, const ConvArgs& a, Products products) {
  float (*const round)(float) = products == Products::kBfloat16 ? ToBfloat16 : ToHalf;
  WithTile(a.cout, [&](auto tile) { HalfTiles<decltype(tile)>(a, round); });
}

void HostBackend::ConvInt8(Stream, const Int8ConvArgs& a) {
  const ConvArgs& c = a.conv;
  std::vector<Int8Accumulators> acc(kInt8Threads);
  std::vector<int8_t> x(kTileRows * kTileDepth), w(kTileCols * kTileDepth);
  std::vector<int32_t> sums(kTileRows * kTileLead);
  for (int64_t row_tile = 0; row_tile < Tiles(c.rows, kTileRows); ++row_tile) {
    for (int64_t col_tile = 0; col_tile < Tiles(c.cout, kTileCols); ++col_tile) {
      const int64_t first_row = row_tile * kTileRows, first_col = col_tile * kTileCols;
      for (int t = 0; t < kInt8Threads; ++t) StartInt8(a, first_col, t, acc[t]);
      TileSources sources;
      for (int64_t k = 0; k < c.taps; ++k) {
        ClearSources(sources);
        for (int t = 0; t < kInt8Threads; ++t) ListSource(c, first_row, k, t, sources);
        if (!sources.any) continue;
        std::fill(sums.begin(), sums.end(), 0);  // the integer fragments start at zero each tap
        for (int64_t c0 = 0; c0 < c.cin; c0 += kTileDepth) {
          for (int t = 0; t < kInt8Threads; ++t) LoadInt8Slice(a, sources, k, c0, first_col, t, x.data(), w.data());
          // What the warps' 16 × 16 × 16 integer products add: exact, in any order.
          for (int r = 0; r < kTileRows; ++r) {
            for (int n = 0; n < kTileCols; ++n) {
              int32_t sum = 0;
              for (int cc = 0; cc < kTileDepth; ++cc) sum += int32_t{x[r * kTileDepth + cc]} * w[n * kTileDepth + cc];
              sums[r * kTileLead + n] += sum;
            }
          }
        }
        for (int t = 0; t < kInt8Threads; ++t) AddInt8Tap(a, sources, k, first_col, t, sums.data(), acc[t]);
      }
      for (int t = 0; t < kInt8Threads; ++t) StoreInt8(a, first_row, first_col, t, acc[t]);
    }
  }
}

}  // namespace sparse_lower
