// Multiply-accumulates per second of one core in registers, for the three ways an AVX2 CPU without
// VNNI can run a conv's products (README: Performance, int8): fp32 FMA (8 per instruction), int16 pairs
// (vpmaddwd + vpaddd, 16) and u8 × s8 quads (vpmaddubsw + vpmaddwd + vpaddd, 32). Twelve independent
// accumulators, as in IndexedConv's tiles; no memory traffic, so these are ceilings.
//
//   g++ -O2 -mavx2 -mfma tools/bench/madd_throughput.cc -o /tmp/madd && /tmp/madd
#include <immintrin.h>

#include <chrono>
#include <cstdio>

namespace {

constexpr long kSteps = 200'000'000 / 12;

template <typename F>
double Seconds(F&& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main() {
  __m256 f[12];
  __m256i s[12];
  for (int i = 0; i < 12; ++i) {
    f[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-9f);
    s[i] = _mm256_set1_epi32(i);
  }
  __m256 a = _mm256_set1_ps(1.0000001f), b = _mm256_set1_ps(0.9999999f);
  __m256i x16 = _mm256_set1_epi16(3), w16 = _mm256_set1_epi16(5), x8 = _mm256_set1_epi8(3), w8 = _mm256_set1_epi8(5);
  const __m256i ones = _mm256_set1_epi16(1);
  const double fma = Seconds([&] {
    for (long n = 0; n < kSteps; ++n) {
      for (int i = 0; i < 12; ++i) f[i] = _mm256_fmadd_ps(a, b, f[i]);
      __asm__ volatile("" : "+x"(a), "+x"(b));  // the operands are not loop-invariant to the compiler
    }
  });
  const double pairs = Seconds([&] {
    for (long n = 0; n < kSteps; ++n) {
      for (int i = 0; i < 12; ++i) s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(x16, w16));
      __asm__ volatile("" : "+x"(x16), "+x"(w16));
    }
  });
  const double quads = Seconds([&] {
    for (long n = 0; n < kSteps; ++n) {
      for (int i = 0; i < 12; ++i) s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(_mm256_maddubs_epi16(x8, w8), ones));
      __asm__ volatile("" : "+x"(x8), "+x"(w8));
    }
  });
  float keep = 0;
  int keep_int = 0;
  for (int i = 0; i < 12; ++i) {
    keep += _mm256_cvtss_f32(f[i]);
    keep_int += _mm256_extract_epi32(s[i], 0);
  }
  const double steps = 12.0 * kSteps;
  std::printf("fp32 FMA %.1f GMAC/s; int16 pairs %.1f GMAC/s (%.2fx); u8 x s8 quads %.1f GMAC/s (%.2fx)  [%g %d]\n",
              8 * steps / fma / 1e9, 16 * steps / pairs / 1e9, 2 * fma / pairs, 32 * steps / quads / 1e9,
              4 * fma / quads, keep, keep_int);
  return 0;
}
