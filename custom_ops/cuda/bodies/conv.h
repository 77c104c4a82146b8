// IndexedConv on a GPU, by tiles: Y[m] = act(B + Σ_k X[idx[m, k]] · W[k] + R[m]) (docs/custom_ops.md).
//
// A block computes a tile of kTileRows output rows × kTileCols output channels. Tap by tap, it lists
// the tile's input rows through the tap (skipping a tap that no row of the tile has: a real LiDAR
// neighbourhood leaves many empty), then walks Cin in slices of kTileDepth: the rows' slice of X is
// gathered into shared memory (zeros for a missing input), W's slice beside it, and the threads
// multiply them into their accumulators. Gather, product and the epilogue (bias, residual, ReLU) are
// one kernel: nothing of size pairs × C goes through memory.
//
// The phases below are the kernel's bodies; a launch runs them in order with a barrier between phases
// (cuda/device/conv.cu on the GPU, cuda/emulated/conv.cc one thread after another on the host). In
// float32 each thread owns a kMicro × kMicro block of the tile and sums in the CPU kernel's order:
// the bias, then the taps in ascending k, each over ascending input channels, by fused multiply-adds.
// In float16 (inputs rounded to half, products summed in float32 on tensor cores) each warp owns a
// kWarpTile × kWarpTile block of 16 × 16 fragments.
//
// A layer of few tiles (the coarse levels: 10,000 rows × 128 channels is 324 tiles for an H100's 132
// multiprocessors) would leave most of the GPU idle while each tile walks its 27 taps, so its taps are
// split across blocks: block z of a tile sums taps [z·per, (z+1)·per) into partial rows of its own, and
// a second pass adds the bias and the partials in ascending z, then the epilogue. The order is fixed by
// the split, never by the scheduling: the same bits run to run.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/hd.h"

namespace sparse_lower {
namespace bodies {

constexpr int kTileRows = 64;
constexpr int kTileCols = 64;  // the widest tile (the int8 kernel's)
constexpr int kTileDepth = 16;
constexpr int kMicro = 4;                                                        // float32: 4 × 4 per thread
constexpr int kWarpTile = 32;                                                     // float16: 32 × 32 per warp
constexpr int kHalfWarps = (kTileRows / kWarpTile) * (kTileCols / kWarpTile);     // 4 in the widest tile

// An output tile of kTileRows rows × Cols columns: 16, 32 or 64, the narrowest that holds Cout
// (TileColumns), so that a layer of 16 output channels computes no column past them.
template <int Cols>
struct Tile {
  static constexpr int kCols = Cols;
  static constexpr int kFloatThreads = (kTileRows / kMicro) * (Cols / kMicro);    // 64, 128, 256
  static constexpr int kWarpCols = Cols < kWarpTile ? Cols : kWarpTile;           // a warp's 32 × 16 or 32 × 32
  static constexpr int kHalfWarps = (kTileRows / kWarpTile) * (Cols / kWarpCols); // 2, 2, 4
  static constexpr int kHalfThreads = 32 * kHalfWarps;
  // leading dimensions of W's half slice and of the float tile the fragments are stored to (the tensor
  // core loads want multiples of 8 halves, the stores of 4 floats)
  static constexpr int kWeightLead = Cols + 8;
  static constexpr int kLead = Cols + 4;
};

SL_HD inline int TileColumns(int64_t cout) { return cout <= 16 ? 16 : cout <= 32 ? 32 : kTileCols; }

// Runs f(Tile<TileColumns(cout)>{}) on the host: how both backends pick the tile their launches take.
template <typename F>
void WithTile(int64_t cout, F f) {
  switch (TileColumns(cout)) {
    case 16:
      return f(Tile<16>{});
    case 32:
      return f(Tile<32>{});
    default:
      return f(Tile<kTileCols>{});
  }
}

// What the products of IndexedConv are computed in: float32 (each thread's FMAs), or X and W rounded to
// float16 or bfloat16 and multiplied on tensor cores, summing in float32. (The values of the C ABI's `half`.)
enum class Products : int32_t { kFloat32 = 0, kFloat16 = 1, kBfloat16 = 2 };

struct ConvArgs {
  const float* x;         // [inputs, cin]
  int64_t inputs, cin;
  const int64_t* idx;     // [rows, taps], every entry in [−1, inputs) (checked before the launch)
  int64_t rows, taps;
  const float* w;         // [taps, cin, cout]
  int64_t cout;
  const float* bias;      // [cout] or null
  const float* residual;  // [rows, cout] or null
  int32_t relu;
  float* y;               // [rows, cout]
  // The split of the taps across blocks (kernels::Conv sets it): block z sums taps [z·split_taps, …).
  int32_t splits = 1;
  int64_t split_taps = 0;  // taps per split (every tap without a split)
  float* partial = nullptr;  // [splits, rows, cout] with a split
};

// The taps block z of a tile sums: [TapsBegin, TapsEnd).
SL_HD inline int64_t TapsBegin(const ConvArgs& a, int z) { return a.splits > 1 ? z * a.split_taps : 0; }
SL_HD inline int64_t TapsEnd(const ConvArgs& a, int z) {
  const int64_t end = TapsBegin(a, z) + a.split_taps;
  return a.splits > 1 && end < a.taps ? end : a.taps;
}

// The inputs of a tile's rows through one tap, and whether any row has one.
struct TileSources {
  int64_t row[kTileRows];
  int32_t any;
};

// Phase 1 (thread 0 alone): the tap starts unused.
SL_HD inline void ClearSources(TileSources& s) { s.any = 0; }

// Phase 2: thread t < kTileRows lists its row's input through tap k (−1 past the last row, and for an
// index outside [0, inputs): refused by the op's check, which a stream may report later).
SL_HD inline void ListSource(const ConvArgs& a, int64_t first_row, int64_t k, int t, TileSources& s) {
  if (t >= kTileRows) return;
  const int64_t m = first_row + t;
  int64_t source = m < a.rows ? a.idx[m * a.taps + k] : -1;
  if (source >= a.inputs) source = -1;
  s.row[t] = source;
  if (source >= 0) s.any = 1;  // every writer writes 1: no order needed
}

// Channel c0 + cc of the input row of tile row r, 0 for a missing input or past Cin.
SL_HD inline float GatheredX(const ConvArgs& a, const TileSources& s, int r, int64_t c0, int cc) {
  const int64_t source = s.row[r];
  const int64_t c = c0 + cc;
  return source >= 0 && c < a.cin ? a.x[source * a.cin + c] : 0.0f;
}

// W[k, c0 + cc, first_col + n], 0 past Cin or Cout.
SL_HD inline float WeightAt(const ConvArgs& a, int64_t k, int64_t c0, int cc, int64_t first_col, int n) {
  const int64_t c = c0 + cc;
  const int64_t o = first_col + n;
  return c < a.cin && o < a.cout ? a.w[(k * a.cin + c) * a.cout + o] : 0.0f;
}

// The epilogue of one element: + R, then the ReLU (NaN stays NaN), as the CPU kernel's FinishRows.
SL_HD inline float Finish(const ConvArgs& a, int64_t m, int64_t o, float value) {
  if (a.residual != nullptr) value += a.residual[m * a.cout + o];
  if (a.relu && value < 0.0f) value = 0.0f;
  return value;
}

// ---- float32 --------------------------------------------------------------------------------------------

// A slice of the tile in shared memory: X transposed (depth-major), so that a thread reads its rows'
// values of one channel side by side.
template <typename T>
struct FloatSlice {
  float x[kTileDepth][kTileRows];
  float w[kTileDepth][T::kCols];
};

// The accumulators of one thread: rows (t / 16)·4 + i, columns (t % 16)·4 + j of the tile.
struct FloatAccumulators {
  float v[kMicro][kMicro];
};

template <typename T>
SL_HD inline int MicroRow(int t) { return (t / (T::kCols / kMicro)) * kMicro; }
template <typename T>
SL_HD inline int MicroCol(int t) { return (t % (T::kCols / kMicro)) * kMicro; }

// The bias of column o where a tile's sums start from it (no split), else 0.
SL_HD inline float StartOf(const ConvArgs& a, int64_t o) {
  return a.splits == 1 && a.bias != nullptr && o < a.cout ? a.bias[o] : 0.0f;
}

// A tile's sum of element (m, o): to Y through the epilogue, or to split z's partial rows.
SL_HD inline void Put(const ConvArgs& a, int z, int64_t m, int64_t o, float sum) {
  if (a.splits > 1) {
    a.partial[(z * a.rows + m) * a.cout + o] = sum;
  } else {
    a.y[m * a.cout + o] = Finish(a, m, o, sum);
  }
}

// The second pass of a split: Y[m, o] = the epilogue of the bias plus the partials in ascending z.
SL_HD inline void AddSplits(const ConvArgs& a, int64_t m, int64_t o) {
  float sum = a.bias != nullptr ? a.bias[o] : 0.0f;
  for (int z = 0; z < a.splits; ++z) sum += a.partial[(z * a.rows + m) * a.cout + o];
  a.y[m * a.cout + o] = Finish(a, m, o, sum);
}

// Before the first tap: the bias (0 without one, or with a split).
template <typename T>
SL_HD inline void StartFloat(const ConvArgs& a, int64_t first_col, int t, FloatAccumulators& acc) {
  for (int j = 0; j < kMicro; ++j) {
    const int64_t o = first_col + MicroCol<T>(t) + j;
    const float start = StartOf(a, o);
    for (int i = 0; i < kMicro; ++i) acc.v[i][j] = start;
  }
}

// Phase 3: thread t loads its share of the slice (channels c0 …) of X and W.
template <typename T>
SL_HD inline void LoadFloatSlice(const ConvArgs& a, const TileSources& s, int64_t k, int64_t c0, int64_t first_col,
                                 int t, FloatSlice<T>& slice) {
  for (int e = t; e < kTileRows * kTileDepth; e += T::kFloatThreads) {
    const int r = e / kTileDepth, cc = e % kTileDepth;
    slice.x[cc][r] = GatheredX(a, s, r, c0, cc);
  }
  for (int e = t; e < kTileDepth * T::kCols; e += T::kFloatThreads) {
    const int cc = e / T::kCols, n = e % T::kCols;
    slice.w[cc][n] = WeightAt(a, k, c0, cc, first_col, n);
  }
}

// Phase 4: thread t multiplies the slice into its accumulators, channel by ascending channel.
template <typename T>
SL_HD inline void MultiplyFloatSlice(const FloatSlice<T>& slice, int t, FloatAccumulators& acc) {
  const int r0 = MicroRow<T>(t), n0 = MicroCol<T>(t);
  for (int cc = 0; cc < kTileDepth; ++cc) {
    float x[kMicro], w[kMicro];
    for (int i = 0; i < kMicro; ++i) x[i] = slice.x[cc][r0 + i];
    for (int j = 0; j < kMicro; ++j) w[j] = slice.w[cc][n0 + j];
    for (int i = 0; i < kMicro; ++i) {
      for (int j = 0; j < kMicro; ++j) acc.v[i][j] = fmaf(x[i], w[j], acc.v[i][j]);
    }
  }
}

// Last: thread t writes its elements (of Y through the epilogue, or of split z's partial rows).
template <typename T>
SL_HD inline void StoreFloat(const ConvArgs& a, int z, int64_t first_row, int64_t first_col, int t,
                             const FloatAccumulators& acc) {
  for (int i = 0; i < kMicro; ++i) {
    const int64_t m = first_row + MicroRow<T>(t) + i;
    if (m >= a.rows) break;
    for (int j = 0; j < kMicro; ++j) {
      const int64_t o = first_col + MicroCol<T>(t) + j;
      if (o < a.cout) Put(a, z, m, o, acc.v[i][j]);
    }
  }
}

// ---- float16 and bfloat16 ---------------------------------------------------------------------------------

// Leading dimension of X's half slice (a multiple of 8 halves, as the tensor core loads want), and of the
// widest float tile (the int8 kernel's sums).
constexpr int kHalfSliceLead = kTileDepth + 8;
constexpr int kTileLead = kTileCols + 4;

// Phase 3 in float16 or bfloat16: thread t loads its share of the slice, rounded by `to_half`, X row-major
// [rows × depth] and W row-major [depth × cols] as the fragments read them.
template <typename T, typename Half, typename ToHalf>
SL_HD inline void LoadHalfSlice(const ConvArgs& a, const TileSources& s, int64_t k, int64_t c0, int64_t first_col,
                                int t, Half* x, Half* w, ToHalf to_half) {
  for (int e = t; e < kTileRows * kTileDepth; e += T::kHalfThreads) {
    const int r = e / kTileDepth, cc = e % kTileDepth;
    x[r * kHalfSliceLead + cc] = to_half(GatheredX(a, s, r, c0, cc));
  }
  for (int e = t; e < kTileDepth * T::kCols; e += T::kHalfThreads) {
    const int cc = e / T::kCols, n = e % T::kCols;
    w[cc * T::kWeightLead + n] = to_half(WeightAt(a, k, c0, cc, first_col, n));
  }
}

// The top-left element of warp `warp`'s block of the tile: (row, column).
template <typename T>
SL_HD inline int WarpRow(int warp) { return (warp / (T::kCols / T::kWarpCols)) * kWarpTile; }
template <typename T>
SL_HD inline int WarpCol(int warp) { return (warp % (T::kCols / T::kWarpCols)) * T::kWarpCols; }

// Last, in float16 or bfloat16: thread t writes its elements of the tile (the sums the fragments stored,
// plus the bias without a split) as StoreFloat does.
template <typename T>
SL_HD inline void StoreHalf(const ConvArgs& a, int z, int64_t first_row, int64_t first_col, int t, const float* tile) {
  for (int e = t; e < kTileRows * T::kCols; e += T::kHalfThreads) {
    const int r = e / T::kCols, n = e % T::kCols;
    const int64_t m = first_row + r, o = first_col + n;
    if (m >= a.rows || o >= a.cout) continue;
    Put(a, z, m, o, tile[r * T::kLead + n] + StartOf(a, o));
  }
}

}  // namespace bodies
}  // namespace sparse_lower
