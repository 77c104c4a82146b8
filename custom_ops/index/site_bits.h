// The output sites of a strided or transposed map as one bit per site of the output grid: where the grid
// is small enough, marking the outputs each input reaches, counting the bits and reading an output's row
// as the count of the bits before it replaces the per-tap lists, their merge and the searches in them
// (with the taps listed once per session, MapGeometry: the CenterPoint backbone's four StridedMaps on the
// real frame, 2 threads, 19.6 → 10.2 ms).
#pragma once

#include <cstdint>
#include <vector>

#include "common/coords.h"
#include "index/geometry.h"
#include "index/neighbours.h"
#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

class SiteBits {
 public:
  // Whether the output grid of `geometry`, over the batches `inputs` hold, is small enough for the bits:
  // at most 64 words per input, so that clearing and counting them costs no more than walking the inputs
  // (the CenterPoint frame's first strided map: 170k words for 80k inputs).
  static bool Fit(const MapGeometry& geometry, const IndexedInput& inputs);

  // The bits of every output some input of `inputs` reaches (Fit must hold).
  SiteBits(const Ort::KernelContext& ctx, const MapGeometry& geometry, const IndexedInput& inputs);

  int64_t Count() const { return rank_.back(); }

  // The row of a marked site among the marked sites in ascending order.
  int64_t Row(int64_t site) const {
    const auto word = static_cast<size_t>(site >> 6);
    return rank_[word] + __builtin_popcountll(words_[word] & ((uint64_t{1} << (site & 63)) - 1));
  }

  // out_coords [Count(), 1 + D]: the marked sites' coordinates in ascending site order.
  void WriteCoords(const Ort::KernelContext& ctx, const Grid& grid, int64_t* out) const;

  // The marked sites in ascending order.
  std::vector<int64_t> Sites(const Ort::KernelContext& ctx) const;

  // nbr [Count(), K] for source "rows": -1, then each input's row at (the row of an output it reaches, the tap).
  void ScatterNeighbours(const Ort::KernelContext& ctx, const MapGeometry& geometry, const IndexedInput& inputs,
                         int64_t* nbr) const;

 private:
  std::vector<uint64_t> words_;
  std::vector<int64_t> rank_;  // rank_[w]: the bits set in words [0, w); one more entry, the total
};

}  // namespace sparse_lower
