// Coordinate tables [N, 1 + D] (batch, d0, ...), the grids they live in and their linear sites.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/sorted_sites.h"
#include "onnxruntime_cxx_api.h"

namespace sparse_lower {

// One grid of a batch: extents, row-major strides, and the linear site b·V + position of a coordinate.
struct Grid {
  Grid() = default;
  // Refuses extents below 1 and a volume V beyond int64. `name` is what messages call the grid.
  Grid(std::vector<int64_t> extent, std::string name);

  size_t Dims() const { return extent.size(); }

  // Writes (batch, d0, ...) of a linear site.
  void Decode(int64_t site, int64_t* coord) const;

  std::vector<int64_t> extent;
  std::vector<int64_t> stride;
  int64_t volume = 1;
  int64_t max_batch = 0;  // the largest batch whose linear sites fit in int64
  std::string name;
};

constexpr size_t kMaxDims = 3;  // spatial dimensions of a grid: 1 to 3

// The grid of attribute spatial_shape (1 to kMaxDims extents), or nothing when the node has none.
std::optional<Grid> SpatialShape(const Ort::ConstKernelInfo& info);

// A coordinate input, its shape checked.
struct Coords {
  const int64_t* Row(int64_t r) const { return data + r * width; }

  const int64_t* data;
  int64_t rows;
  int64_t width;  // 1 + D
};

// When optional input `index` (coords [N, 1 + D]) is given, checks that the `rows` rows of feature input X
// pair with it row by row: a gather from X is only right for the coords its table was built from.
void CheckCoordsPairing(const Ort::KernelContext& ctx, size_t index, int64_t rows);

// Input `index`, which must be [N, 1 + dims]. `name` is what messages call it.
Coords ReadCoords(const Ort::KernelContext& ctx, size_t index, const char* name, size_t dims);

// The linear site of every row, each coordinate checked: batch ≥ 0, batch ≤ max_batch (so that sites of
// every grid involved fit in int64), batch < batch_size when batch_size > 0, and every spatial
// coordinate inside the grid.
std::vector<int64_t> LinearSites(const Ort::KernelContext& ctx, const Coords& coords, const Grid& grid,
                                 const char* name, int64_t max_batch, int64_t batch_size = 0);

// The sites of a coordinate input sorted, refusing two equal rows (naming the first row that repeats an
// earlier one, and that one). O(N) when the rows are sorted already, as every builder's outputs are.
SortedSites SortSites(const std::vector<int64_t>& sites, const Coords& coords, const char* name);

// Writes the coordinates of `sites` as rows of out [sites.size(), 1 + D].
void WriteCoords(const Ort::KernelContext& ctx, const std::vector<int64_t>& sites, const Grid& grid, int64_t* out);

}  // namespace sparse_lower
