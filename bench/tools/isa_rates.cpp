// Instructions a core retires per second for the products the engine's kernels are built on:
// 512-bit VPDPWSSD (int16 pairs, the prefill tiles), VPDPBUSD (int8 quads, decode), VFMADD
// (fp32, OpenBLAS's SGEMM) and VDPBF16PS (bf16 pairs), each over 20 independent chains so
// that latency does not bound them. What sets the tiles' choice of int16 over int8
// (bench/results/engine-2026-12-01b.md). ./build/bench/relokv_isa_rates
#include <immintrin.h>

#include <chrono>
#include <cstdio>

// GCC 12's false -Wuninitialized inside the AVX-512 reduce intrinsics (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BF16__)
namespace {

template <class Step>
double rate(Step step) {
  constexpr long kIters = 50'000'000;
  const auto t0 = std::chrono::steady_clock::now();
  for (long k = 0; k < kIters; ++k) step();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 20.0 * kIters / s / 1e9;
}

// clang-format off
#define RELOKV_20(X) \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) \
  X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19)
// clang-format on

}  // namespace

int main() {
#define RELOKV_DECL(i)                 \
  __m512i a##i = _mm512_set1_epi32(i); \
  __m512 f##i = _mm512_set1_ps(static_cast<float>(i));
  RELOKV_20(RELOKV_DECL)
  __m512i b = _mm512_set1_epi32(3), c = _mm512_set1_epi32(5);
  __m512 fb = _mm512_set1_ps(1.0001f), fc = _mm512_set1_ps(0.999f);
  for (int rep = 0; rep < 3; ++rep) {
#define RELOKV_WSSD(i) a##i = _mm512_dpwssd_epi32(a##i, b, c);
#define RELOKV_BUSD(i) a##i = _mm512_dpbusd_epi32(a##i, b, c);
#define RELOKV_FMA(i) f##i = _mm512_fmadd_ps(f##i, fb, fc);
#define RELOKV_BF16(i) \
  f##i = _mm512_dpbf16_ps(f##i, __builtin_bit_cast(__m512bh, b), __builtin_bit_cast(__m512bh, c));
    const double wssd = rate([&] {
      RELOKV_20(RELOKV_WSSD)
      __asm__ volatile("" : "+v"(b));
    });
    const double busd = rate([&] {
      RELOKV_20(RELOKV_BUSD)
      __asm__ volatile("" : "+v"(b));
    });
    const double fma = rate([&] {
      RELOKV_20(RELOKV_FMA)
      __asm__ volatile("" : "+v"(fb));
    });
    const double bf = rate([&] {
      RELOKV_20(RELOKV_BF16)
      __asm__ volatile("" : "+v"(b));
    });
    std::printf(
        "G instructions/s, one core: vpdpwssd %.2f  vpdpbusd %.2f  vfmadd %.2f  vdpbf16ps %.2f"
        "  (multiply-adds/s: int16 %.0f G, int8 %.0f G, fp32 %.0f G, bf16 %.0f G)\n",
        wssd, busd, fma, bf, 32 * wssd, 64 * busd, 16 * fma, 32 * bf);
  }
  int sink = 0;
#define RELOKV_SINK(i) \
  sink += _mm512_reduce_add_epi32(a##i) + static_cast<int>(_mm512_reduce_add_ps(f##i));
  RELOKV_20(RELOKV_SINK)
  return sink == 42 ? 1 : 0;
}
#else
int main() {
  std::printf("this build has no AVX-512 VNNI and BF16: nothing to measure\n");
  return 0;
}
#endif
