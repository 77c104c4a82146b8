#include "index/site_bits.h"

#include <algorithm>

#include "common/bit_count.h"
#include "common/parallel.h"

namespace sparse_lower {
namespace {

constexpr int64_t kWordsPerInput = 64;
constexpr int64_t kWordGrain = 1 << 14;  // words per block of the counting and decoding passes

// The words of a grid of `volume` sites per batch over batches [0, batches).
int64_t WordCount(int64_t volume, int64_t batches) { return (volume * batches + 63) / 64; }

// The batches [0, B) the inputs hold: their sites ascend, so the last has the largest batch.
int64_t Batches(const MapGeometry& geometry, const IndexedInput& inputs) {
  return inputs.sites.site.back() / geometry.In().volume + 1;
}

// Calls f(input row, k, output site) for every output some input reaches through tap k, the inputs in
// ascending site order, in blocks of inputs run in parallel.
template <typename F>
void ForEachReached(const Ort::KernelContext& ctx, const MapGeometry& geometry, const IndexedInput& inputs, F&& f) {
  const Coords& coords = inputs.coords;
  const std::vector<int64_t>& rows = inputs.sites.row;
  const int64_t volume = geometry.Out().volume;
  ParallelFor(ctx, static_cast<int64_t>(rows.size()), Grain(4 * geometry.Taps()), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> scratch;
    CountingBits([&] {
      for (int64_t j = begin; j < end; ++j) {
        if (j + kPrefetchAhead < end) __builtin_prefetch(coords.Row(rows[j + kPrefetchAhead]));
        const int64_t input = rows[j];
        const int64_t* c = coords.Row(input);
        const int64_t base = c[0] * volume;
        geometry.ForEachOutput(c + 1, scratch, [&](int64_t k, int64_t position) { f(input, k, base + position); });
      }
    });
  });
}

}  // namespace

bool SiteBits::Fit(const MapGeometry& geometry, const IndexedInput& inputs) {
  const std::vector<int64_t>& sites = inputs.sites.site;
  if (sites.empty()) return false;
  const int64_t batches = Batches(geometry, inputs);
  const int64_t volume = geometry.Out().volume;
  const auto limit = kWordsPerInput * static_cast<int64_t>(sites.size());
  return volume <= 64 * limit / batches && WordCount(volume, batches) <= limit;
}

SiteBits::SiteBits(const Ort::KernelContext& ctx, const MapGeometry& geometry, const IndexedInput& inputs) {
  const int64_t words = WordCount(geometry.Out().volume, Batches(geometry, inputs));
  words_.resize(static_cast<size_t>(words));  // zeroed
  // Blocks of inputs in ascending site order mark words that mostly no other block marks, and an output
  // reached again is mostly marked already: the atomic OR is rare.
  ForEachReached(ctx, geometry, inputs, [&](int64_t, int64_t, int64_t site) {
    uint64_t& word = words_[static_cast<size_t>(site >> 6)];
    const uint64_t bit = uint64_t{1} << (site & 63);
    if ((__atomic_load_n(&word, __ATOMIC_RELAXED) & bit) == 0) __atomic_fetch_or(&word, bit, __ATOMIC_RELAXED);
  });
  // The bits before each word: per block, then across blocks.
  const int64_t blocks = BlockCount(words, kWordGrain);
  std::vector<int64_t> block_bits(static_cast<size_t>(blocks) + 1, 0);
  ParallelBlocks(ctx, blocks, [&](int64_t block) {
    int64_t bits = 0;
    CountingBits([&] {
      for (int64_t w = block * kWordGrain; w < std::min(words, (block + 1) * kWordGrain); ++w) {
        bits += __builtin_popcountll(words_[static_cast<size_t>(w)]);
      }
    });
    block_bits[static_cast<size_t>(block) + 1] = bits;
  });
  for (size_t b = 1; b < block_bits.size(); ++b) block_bits[b] += block_bits[b - 1];
  rank_.resize(static_cast<size_t>(words) + 1);
  rank_.back() = block_bits.back();
  ParallelBlocks(ctx, blocks, [&](int64_t block) {
    int64_t bits = block_bits[static_cast<size_t>(block)];
    CountingBits([&] {
      for (int64_t w = block * kWordGrain; w < std::min(words, (block + 1) * kWordGrain); ++w) {
        rank_[static_cast<size_t>(w)] = bits;
        bits += __builtin_popcountll(words_[static_cast<size_t>(w)]);
      }
    });
  });
}

void SiteBits::WriteCoords(const Ort::KernelContext& ctx, const Grid& grid, int64_t* out) const {
  const auto words = static_cast<int64_t>(words_.size());
  const auto width = static_cast<int64_t>(1 + grid.Dims());
  const int64_t line = grid.extent.back();  // sites of one line of the last dimension
  ParallelFor(ctx, words, kWordGrain, [&](int64_t begin, int64_t end) {
    int64_t* row = out + rank_[static_cast<size_t>(begin)] * width;
    int64_t line_start = 0, line_end = 0;  // the sites of the line the last site decoded lies on
    int64_t coord[1 + kMaxDims];
    for (int64_t w = begin; w < end; ++w) {
      for (uint64_t bits = words_[static_cast<size_t>(w)]; bits != 0; bits &= bits - 1) {
        const int64_t site = w * 64 + __builtin_ctzll(bits);
        if (site >= line_end) {  // a new line: the one full decode (divisions) per line, not per site
          grid.Decode(site, coord);
          line_start = site - coord[width - 1];
          line_end = line_start + line;
        }
        coord[width - 1] = site - line_start;
        std::copy(coord, coord + width, row);
        row += width;
      }
    }
  });
}

std::vector<int64_t> SiteBits::Sites(const Ort::KernelContext& ctx) const {
  std::vector<int64_t> sites(static_cast<size_t>(Count()));
  ParallelFor(ctx, static_cast<int64_t>(words_.size()), kWordGrain, [&](int64_t begin, int64_t end) {
    int64_t* site = sites.data() + rank_[static_cast<size_t>(begin)];
    for (int64_t w = begin; w < end; ++w) {
      for (uint64_t bits = words_[static_cast<size_t>(w)]; bits != 0; bits &= bits - 1) {
        *site++ = w * 64 + __builtin_ctzll(bits);
      }
    }
  });
  return sites;
}

void SiteBits::ScatterNeighbours(const Ort::KernelContext& ctx, const MapGeometry& geometry,
                                 const IndexedInput& inputs, int64_t* nbr) const {
  const int64_t taps = geometry.Taps();
  ParallelFor(ctx, Count() * taps, 1 << 15, [&](int64_t begin, int64_t end) { std::fill(nbr + begin, nbr + end, -1); });
  // Each (output, tap) slot is reached from one input at most: blocks of inputs never write the same slot.
  ForEachReached(ctx, geometry, inputs,
                 [&](int64_t input, int64_t k, int64_t site) { nbr[Row(site) * taps + k] = input; });
}

}  // namespace sparse_lower
