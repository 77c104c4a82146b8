// The row loop shared by the vector paths of the row GEMMs (conv/row_gemm.cc, conv/row_gemm_int8.cc): rows
// are taken kTileRows = 6 at a time (6 rows of accumulators fill the registers the tiles have), and the
// next tile's rows are prefetched while one is multiplied, since the rows are gathered by address and
// the hardware prefetcher cannot guess them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace sparse_lower {

constexpr int kTileRows = 6;

// Calls tile(std::integral_constant<int, kRows>{}, i) for the rows [i, i + kRows) of [0, n): kTileRows
// rows at a time, then the 1 to 5 left; prefetch(j) for each row j of the next tile before a tile.
template <typename Prefetch, typename Tile>
void ForEachRowTile(int64_t n, Prefetch prefetch, Tile tile) {
  static_assert(kTileRows == 6, "the remainder below is written for tiles of 6 rows");
  int64_t i = 0;
  for (; i + kTileRows <= n; i += kTileRows) {
    for (int64_t j = i + kTileRows; j < std::min(n, i + 2 * kTileRows); ++j) prefetch(j);
    tile(std::integral_constant<int, kTileRows>{}, i);
  }
  switch (n - i) {
    case 5: tile(std::integral_constant<int, 5>{}, i); break;
    case 4: tile(std::integral_constant<int, 4>{}, i); break;
    case 3: tile(std::integral_constant<int, 3>{}, i); break;
    case 2: tile(std::integral_constant<int, 2>{}, i); break;
    case 1: tile(std::integral_constant<int, 1>{}, i); break;
    default: break;
  }
}

}  // namespace sparse_lower
