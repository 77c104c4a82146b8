// The multiply-accumulate of IndexedConvInt8: the row GEMM of conv/row_gemm.h on 8-bit rows and weights.
#pragma once

#include <cstdint>
#include <vector>

namespace sparse_lower {

// W [Cin, Cout] int8 in the order the kernel reads it: Cin padded with zeros to whole octets of 8 input
// channels (RowBytes) and Cout to whole pairs of blocks of 8 columns, block by block. Within a block, the
// layout of the path that runs here (common/vector_units.h):
//   * kQuads (x86 but AMX, SDOT, portable): each quad of 4 channels' 8 columns × 4 channels as 32
//     consecutive bytes (the operand of one vpmaddubsw, or two SDOTs);
//   * kOctets (I8MM): each octet of 8 channels' 4 pairs of columns, a pair's 2 columns × 8 channels as 16
//     consecutive bytes (the operand of one USMMLA).
// With AMX (kTiles, for layers of 64 input channels or more) the blocks are not apart: each pair of
// blocks (16 columns) is cut into chunks of Depth() quads (16, or all of a narrower row's; Cin padded with
// zeros to whole chunks), each chunk one tile of Depth() rows of 64 bytes, a quad's 16 columns × 4
// channels to a row (the B operand of one tdpbusd), at Tile(pair, chunk).
class PackedWeights {
 public:
  enum class Layout { kQuads, kOctets, kTiles };

  PackedWeights(const int8_t* w, int64_t cin, int64_t cout);
  // The bytes of an input row of Cin channels, whole octets: what the rows given to AccumulateRowsInt8 hold.
  static int64_t RowBytes(int64_t cin) { return 8 * ((cin + 7) / 8); }
  Layout Packing() const { return layout_; }
  int64_t Quads() const { return quads_; }
  int64_t Depth() const { return quads_ < 16 ? quads_ : 16; }
  int64_t Chunks() const { return (quads_ + Depth() - 1) / Depth(); }
  const int8_t* Block(int64_t block) const { return bytes_.data() + block * quads_ * 32; }
  const int8_t* Tile(int64_t pair, int64_t chunk) const {
    return bytes_.data() + (pair * Chunks() + chunk) * Depth() * 64;
  }
  // 128 · Σ_c w[c][o] per padded column: what SDOT's signed codes (a − 128) leave out of each sum.
  const int32_t* Offsets() const { return offsets_.data(); }
  // Whether some |w| exceeds 63, past which AVX2's vpmaddubsw pair sums could saturate.
  bool Wide() const { return wide_; }

 private:
  Layout layout_;
  int64_t quads_;
  std::vector<int8_t> bytes_;
  std::vector<int32_t> offsets_;
  bool wide_ = false;
};

// y[i][o] += scale[o] · Σ_c a[i][c] · w[c][o] for i in [0, n), o in [0, cout): a[i] are u8 rows of
// PackedWeights::RowBytes(Cin) bytes (zero past Cin). The sums are exact in int32 (on AVX2 without VNNI only
// for |w| ≤ 63, where a pair of products never exceeds vpmaddubsw's int16, 2·255·63 < 32767: wider weights take
// the portable loop there), and below 2^24, where float holds them exactly (the caller's bound: Cin · 255 · |w|),
// then scaled and added with one rounding (an FMA). Uses AMX, AVX-512 VNNI or AVX2,
// or on aarch64 I8MM or SDOT, where the CPU has them (common/vector_units.h); every path gives the same bits.
void AccumulateRowsInt8(const uint8_t* const* a, float* const* y, int64_t n, const PackedWeights& w, const float* scale,
                        int64_t cout);

}  // namespace sparse_lower
