// Multiply-accumulates per second of one core in registers, for the three ways an AVX2 CPU without VNNI can
// run a conv's products (docs/performance.md: int8 on the gpu target): fp32 FMA (8 per instruction), int16
// pairs (vpmaddwd + vpaddd, 16) and u8 × s8 quads (vpmaddubsw + vpmaddwd + vpaddd, 32). Twelve independent
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

// Twelve accumulators as locals (an array, or a lambda's captures, would live in memory and measure
// store-to-load forwarding instead), each stepped by STEP(acc) kSteps times.
#define TWELVE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define TIMED(INIT, STEP, RESULT)                                \
  [&] {                                                          \
    TWELVE(INIT)                                                 \
    const double seconds = Seconds([&] {                         \
      for (long n = 0; n < kSteps; ++n) {                        \
        TWELVE(STEP)                                             \
      }                                                          \
    });                                                          \
    TWELVE(RESULT)                                               \
    return seconds;                                              \
  }()

int main() {
  const __m256 a = _mm256_set1_ps(1.0000001f), b = _mm256_set1_ps(0.9999999f);
  const __m256i x16 = _mm256_set1_epi16(3), w16 = _mm256_set1_epi16(5), x8 = _mm256_set1_epi8(3),
                w8 = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
  float keep = 0;
  int keep_int = 0;
#define FLOAT_INIT(i) __m256 f##i = _mm256_set1_ps(static_cast<float>(i) * 1e-9f);
#define INT_INIT(i) __m256i s##i = _mm256_set1_epi32(i);
#define FMA_STEP(i) f##i = _mm256_fmadd_ps(a, b, f##i);
#define PAIRS_STEP(i) s##i = _mm256_add_epi32(s##i, _mm256_madd_epi16(x16, w16));
#define QUADS_STEP(i) s##i = _mm256_add_epi32(s##i, _mm256_madd_epi16(_mm256_maddubs_epi16(x8, w8), ones));
#define FLOAT_RESULT(i) keep += _mm256_cvtss_f32(f##i);
#define INT_RESULT(i) keep_int += _mm256_extract_epi32(s##i, 0);
  // The operands are constants to the compiler, but the loop cannot be folded: each step reads its result.
  const double fma = TIMED(FLOAT_INIT, FMA_STEP, FLOAT_RESULT);
  const double pairs = TIMED(INT_INIT, PAIRS_STEP, INT_RESULT);
  const double quads = TIMED(INT_INIT, QUADS_STEP, INT_RESULT);
  const double steps = 12.0 * kSteps;
  std::printf("fp32 FMA %.1f GMAC/s; int16 pairs %.1f GMAC/s (%.2fx); u8 x s8 quads %.1f GMAC/s (%.2fx)  [%g %d]\n",
              8 * steps / fma / 1e9, 16 * steps / pairs / 1e9, 2 * fma / pairs, 32 * steps / quads / 1e9,
              4 * fma / quads, keep, keep_int);
  return 0;
}
