// Prefill products on AMX tiles (see qgemm.hpp): each weight and each activation split into
// two bf16 terms, hi + lo, and three tile products (Xhi Whi + Xlo Whi + Xhi Wlo) accumulated
// in fp32. A bf16 holds 8 significant bits, a pair 16: the quantized weights' values (an fp16
// scale times a 4- to 8-bit integer, plus an fp16 minimum) keep about 16 of theirs, the
// activations too, so the products carry ~2^-17 relative error per term, less than the int16
// tiles' and far less than plain bf16's 2^-9 (which would flip near-tied logits).
#include "gguf.hpp"
#include "isa.hpp"
#include "qgemm.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

// The library's AMX pieces (the tile grant, configuration and pair splits) are shared with its
// attention kernels.
#include <relokv/attention/detail/amx_bf16.hpp>
#include <relokv/dtype.hpp>
#define RELOKV_ENGINE_AMX RELOKV_HOST_AMX

// GCC 12 reports a false -Wmaybe-uninitialized inside AVX-512 intrinsics (GCC bug 105593).
#if RELOKV_ENGINE_AMX && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace relokv_engine {
namespace {

std::atomic<bool> g_amx{true};

// fp32 to bf16 bits (rounded to nearest even) and back: relokv's own bf16.
std::uint16_t bf16_bits(float v) noexcept { return relokv::bf16::from_float(v).bits; }
float bf16_value(std::uint16_t b) noexcept { return relokv::bf16{b}.to_float(); }

// v as hi + lo, both bf16.
void split_row(const float* v, std::int32_t n, std::uint16_t* hi, std::uint16_t* lo) {
  std::int32_t j = 0;
#if RELOKV_ENGINE_AMX
  for (; j + 16 <= n; j += 16) {
    __m256i h, l;
    relokv::detail::amx::split16(_mm512_loadu_ps(v + j), h, l);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + j), h);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + j), l);
  }
#endif
  for (; j < n; ++j) {
    hi[j] = bf16_bits(v[j]);
    lo[j] = bf16_bits(v[j] - bf16_value(hi[j]));
  }
}

// Row r of w as fp32: Q4_0, Q4_1 and Q8_0 (SmolLM2's types) with AVX-512, as
// dequantize_blocks computes them (d * q + m, fused); the other types through it.
void dequantize(const qmatrix& w, std::int32_t r, float* out) {
#if RELOKV_ENGINE_AMX
  const std::uint8_t* p = w.row(r);
  const std::int32_t nb = w.cols / 32;
  switch (w.type) {
    case ggml_type::kQ4_0:
    case ggml_type::kQ4_1: {
      const bool q41 = w.type == ggml_type::kQ4_1;
      const std::size_t bytes = q41 ? 20 : 18;
      const __m512i low = _mm512_set1_epi32(0xF);
      for (std::int32_t b = 0; b < nb; ++b, p += bytes, out += 32) {
        const float d = fp16_at(p);
        const __m512 vd = _mm512_set1_ps(d), vm = _mm512_set1_ps(q41 ? fp16_at(p + 2) : -8.0f * d);
        const __m512i q = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + (q41 ? 4 : 2))));
        _mm512_storeu_ps(out,
                         _mm512_fmadd_ps(vd, _mm512_cvtepi32_ps(_mm512_and_si512(q, low)), vm));
        _mm512_storeu_ps(out + 16,
                         _mm512_fmadd_ps(vd, _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), vm));
      }
      return;
    }
    case ggml_type::kQ8_0:
      for (std::int32_t b = 0; b < nb; ++b, p += 34, out += 32) {
        const __m512 vd = _mm512_set1_ps(fp16_at(p));
        for (int h = 0; h < 2; ++h)
          _mm512_storeu_ps(
              out + 16 * h,
              _mm512_mul_ps(vd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                    reinterpret_cast<const __m128i*>(p + 2 + 16 * h))))));
      }
      return;
    default:
      break;
  }
#endif
  w.dequantize_row(r, out);
}

// Grows v to at least n elements and never shrinks it: a buffer sized for each product in
// turn would otherwise be zeroed again whenever it grows back (a resize value-initializes).
template <class V>
void grow(V& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
}

constexpr std::int32_t kTile = 16;  // rows of a tile; a tile row holds 32 bf16 (64 bytes)
constexpr std::int32_t kStep = 32;  // the products' depth per tile instruction
// Steps per chunk: 32 activation rows of 4 steps (hi and lo) are 16 KiB, a third of L1.
[[maybe_unused]] constexpr std::int32_t kChunkSteps = 4;
// Column pairs whose C tiles are parked at once (4 KiB each).
[[maybe_unused]] constexpr std::int32_t kPairsAtOnce = 4;
// 16 fp32, one cache line: the parked C tiles load and store whole lines.
struct alignas(64) c_line {
  float v[16];
};

// Rows [r0, r1) of w, 16 to a tile column, as the tiles' right-hand operand: per tile
// column, plane (hi, lo) and step of 32 elements, one 16 x 16 tile of bf16 pairs: row kk
// holds, for each of the 16 weight rows, its elements 2kk and 2kk + 1 of the step. Rows past
// r1, up to a whole pair of tile columns, are zeros.
struct amx_panel {
  std::vector<bf16_activations::line> b;  // cache-line aligned, as the tile loads want
  std::vector<float> rows;
  std::vector<std::uint16_t> hi, lo;
  std::int32_t tiles = 0, steps = 0;

  [[nodiscard]] const std::uint16_t* tile(std::int32_t t, int plane, std::int32_t s) const {
    return reinterpret_cast<const std::uint16_t*>(b.data()) +
           ((static_cast<std::size_t>(t) * 2 + static_cast<std::size_t>(plane)) *
                static_cast<std::size_t>(steps) +
            static_cast<std::size_t>(s)) *
               512;
  }

  void pack(const qmatrix& w, std::int32_t r0, std::int32_t r1) {
    const auto cols = static_cast<std::size_t>(w.cols);
    steps = w.cols / kStep;
    tiles = (r1 - r0 + 2 * kTile - 1) / (2 * kTile) * 2;  // whole pairs of tile columns
    grow(b, static_cast<std::size_t>(tiles) * 2 * static_cast<std::size_t>(steps) * 16);
    grow(rows, cols * kTile);
#if !RELOKV_ENGINE_AMX
    grow(hi, cols * kTile);
    grow(lo, cols * kTile);
#endif
    for (std::int32_t t = 0; t < tiles; ++t) {
      for (std::int32_t n = 0; n < kTile; ++n) {
        const std::int32_t r = r0 + t * kTile + n;
        float* dst = rows.data() + static_cast<std::size_t>(n) * cols;
        if (r < r1)
          dequantize(w, r, dst);
        else
          std::fill_n(dst, cols, 0.0f);
      }
#if RELOKV_ENGINE_AMX
      for (std::int32_t s = 0; s < steps; ++s)
        relokv::detail::amx::split_pairs(rows.data() + static_cast<std::size_t>(s) * kStep, cols,
                                         kTile, const_cast<std::uint16_t*>(tile(t, 0, s)),
                                         const_cast<std::uint16_t*>(tile(t, 1, s)));
#else
      for (std::int32_t n = 0; n < kTile; ++n)
        split_row(rows.data() + static_cast<std::size_t>(n) * cols, w.cols,
                  hi.data() + static_cast<std::size_t>(n) * cols,
                  lo.data() + static_cast<std::size_t>(n) * cols);
      for (int plane = 0; plane < 2; ++plane) {
        const std::uint16_t* src = plane == 0 ? hi.data() : lo.data();
        for (std::int32_t s = 0; s < steps; ++s) {
          auto* dst = const_cast<std::uint16_t*>(tile(t, plane, s));
          for (int kk = 0; kk < kTile; ++kk)
            for (int n = 0; n < kTile; ++n) {
              const std::uint16_t* pair = src + static_cast<std::size_t>(n) * cols +
                                          static_cast<std::size_t>(s) * kStep +
                                          static_cast<std::size_t>(2 * kk);
              dst[kk * 32 + n * 2] = pair[0];
              dst[kk * 32 + n * 2 + 1] = pair[1];
            }
        }
      }
#endif
    }
  }
};

#if RELOKV_ENGINE_AMX
// Steps [s0, s1) (32 elements each) of the three products of 32 activation rows (from a:
// rows ld apart, hi then lo) with tile columns b0 and b1 of the panel, into the four C tiles
// at c (1 KiB each: rows 0-15 and 16-31 by b0 and b1), which start from zero when s0 == 0.
// A step runs Xlo Whi, Xhi Whi, Xhi Wlo on the four C tiles, so that eight loads serve its
// twelve products; each operand is reloaded right after its last product. What sets the rate
// is where the operands sit (relokv_amx_rates: ~0.8 of TDPBF16PS's peak with one operand in
// L1, ~0.6 with both in L2) and that their rows start cache lines (~0.6 when not).
void steps(const std::uint16_t* a, std::size_t ld, std::size_t cols, const amx_panel& p,
           std::int32_t t, std::int32_t s0, std::int32_t s1, float* c) {
  const std::size_t lda = ld * 2;
  const std::uint16_t* a1 = a + 16 * ld;  // rows 16-31
  const auto xh = [&](const std::uint16_t* r, std::int32_t s) {
    return r + static_cast<std::size_t>(s) * kStep;
  };
  const auto xl = [&](const std::uint16_t* r, std::int32_t s) {
    return r + cols + static_cast<std::size_t>(s) * kStep;
  };
  if (s0 == 0) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, c, 64);
    _tile_loadd(1, c + 256, 64);
    _tile_loadd(2, c + 512, 64);
    _tile_loadd(3, c + 768, 64);
  }
  _tile_loadd(4, xl(a, s0), lda);
  _tile_loadd(5, xl(a1, s0), lda);
  _tile_loadd(6, p.tile(t, 0, s0), 64);
  _tile_loadd(7, p.tile(t + 1, 0, s0), 64);
  for (std::int32_t s = s0; s < s1; ++s) {
    // Xlo Whi; then the rows' hi tiles.
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(4, xh(a, s), lda);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    _tile_loadd(5, xh(a1, s), lda);
    // Xhi Whi; then the columns' lo tiles.
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    _tile_loadd(6, p.tile(t, 1, s), 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(3, 5, 7);
    _tile_loadd(7, p.tile(t + 1, 1, s), 64);
    // Xhi Wlo; then the next step's Xlo and Whi.
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (s + 1 < s1) _tile_loadd(4, xl(a, s + 1), lda);
    _tile_dpbf16ps(2, 5, 6);
    if (s + 1 < s1) _tile_loadd(6, p.tile(t, 0, s + 1), 64);
    _tile_dpbf16ps(3, 5, 7);
    if (s + 1 < s1) {
      _tile_loadd(5, xl(a1, s + 1), lda);
      _tile_loadd(7, p.tile(t + 1, 0, s + 1), 64);
    }
  }
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  _tile_stored(2, c + 512, 64);
  _tile_stored(3, c + 768, 64);
}
#endif

}  // namespace

bool has_amx_tiles() noexcept {
#if RELOKV_ENGINE_AMX
  return g_amx.load(std::memory_order_relaxed) && integer_kernels_on() &&
         isa_cap() >= isa_level::kAmx && relokv::detail::amx::granted();
#else
  return false;
#endif
}

void use_amx_tiles(bool on) noexcept { g_amx.store(on, std::memory_order_relaxed); }

void bf16_activations::size(std::int32_t rows, std::int32_t width) {
  if (width % kStep != 0)
    throw std::logic_error("amx: rows of " + std::to_string(width) + " (not whole steps of 32)");
  n = rows;
  cols = width;
  padded = (rows + 2 * kTile - 1) / (2 * kTile) * (2 * kTile);
  const std::size_t ld = 2 * static_cast<std::size_t>(width);
  grow(lines, static_cast<std::size_t>(padded) * ld / 32);
  std::fill(data() + static_cast<std::size_t>(rows) * ld,
            data() + static_cast<std::size_t>(padded) * ld, std::uint16_t{0});
}

void bf16_activations::convert_rows(const float* x, std::int32_t i0, std::int32_t i1) {
  const auto c = static_cast<std::size_t>(cols);
  for (std::int32_t i = i0; i < i1; ++i) {
    std::uint16_t* hi = data() + static_cast<std::size_t>(i) * 2 * c;
    split_row(x + static_cast<std::size_t>(i) * c, cols, hi, hi + c);
  }
}

void amx_matmul_rows(const qmatrix& w, const bf16_activations& x, float* y, std::int32_t ldy,
                     std::int32_t r0, std::int32_t r1) {
  if (r1 <= r0 || x.n <= 0) return;
  if (x.cols != w.cols)
    throw std::logic_error("amx: activations of " + std::to_string(x.cols) + " for a matrix of " +
                           std::to_string(w.cols) + " columns");
  // Panels of at most ~1 MiB (half of a core's L2), whole pairs of tile columns.
  const std::int32_t chunk = std::max<std::int32_t>(
      2 * kTile,
      static_cast<std::int32_t>((std::size_t{1} << 20) / (4 * static_cast<std::size_t>(w.cols))) /
          (2 * kTile) * (2 * kTile));
  thread_local amx_panel p;
#if RELOKV_ENGINE_AMX
  const bool tiles = has_amx_tiles();
  if (tiles) relokv::detail::amx::configure();
  thread_local std::vector<c_line> parked;  // the C tiles of a row block: per column pair, 4 KiB
#endif
  for (std::int32_t c0 = r0; c0 < r1; c0 += chunk) {
    const std::int32_t c1 = std::min(r1, c0 + chunk);
    p.pack(w, c0, c1);
#if RELOKV_ENGINE_AMX
    if (tiles) {
      // 32 activation rows at a time; their steps in chunks whose rows (16 KiB) stay in L1
      // while every tile column pair of the panel (in L2) passes, the C tiles parked in memory.
      const std::size_t ld = 2 * static_cast<std::size_t>(x.cols);
      const std::int32_t n = p.steps;
      grow(parked, static_cast<std::size_t>(p.tiles / 2) * 64);
      for (std::int32_t m0 = 0; m0 < x.padded; m0 += 2 * kTile) {
        const std::uint16_t* a = x.data() + static_cast<std::size_t>(m0) * ld;
        // The panel's column pairs a few at a time, so that their parked C tiles stay in L1
        // beside the rows' chunk.
        for (std::int32_t t0 = 0; t0 < p.tiles; t0 += 2 * kPairsAtOnce) {
          const std::int32_t t1 = std::min(p.tiles, t0 + 2 * kPairsAtOnce);
          for (std::int32_t j0 = 0; j0 < n; j0 += kChunkSteps) {
            const std::int32_t j1 = std::min(n, j0 + kChunkSteps);
            for (std::int32_t t = t0; t < t1; t += 2)
              steps(
                  a, ld, static_cast<std::size_t>(x.cols), p, t, j0, j1,
                  reinterpret_cast<float*>(parked.data()) + static_cast<std::size_t>(t / 2) * 1024);
          }
        }
        const std::int32_t mend = std::min(x.n, m0 + 2 * kTile);
        for (std::int32_t t = 0; t < p.tiles; t += 2) {
          const float* cb = reinterpret_cast<const float*>(parked.data()) +
                            static_cast<std::size_t>(t / 2) * 1024;
          for (int q = 0; q < 2; ++q) {  // tile columns t, t + 1
            const std::int32_t col = c0 + (t + q) * kTile;
            const std::int32_t ncols = std::min(c1 - col, kTile);
            if (ncols <= 0) continue;
            const auto keep = static_cast<__mmask16>((1u << ncols) - 1u);
            for (std::int32_t m = m0; m < mend; ++m) {
              const int half = (m - m0) / kTile, row = (m - m0) % kTile;
              _mm512_mask_storeu_ps(
                  y + static_cast<std::size_t>(m) * static_cast<std::size_t>(ldy) +
                      static_cast<std::size_t>(col),
                  keep, _mm512_load_ps(cb + (half * 2 + q) * 256 + row * kTile));
            }
          }
        }
      }
      continue;
    }
#endif
    // Without AMX: the same three products by plain loops (the reference of the tiles).
    const auto width = static_cast<std::size_t>(x.cols);
    for (std::int32_t m = 0; m < x.n; ++m) {
      const std::uint16_t* xh = x.data() + static_cast<std::size_t>(m) * 2 * width;
      const std::uint16_t* xl = xh + width;
      for (std::int32_t r = c0; r < c1; ++r) {
        const std::int32_t t = (r - c0) / kTile, n = (r - c0) % kTile;
        float acc = 0.0f;
        for (std::int32_t s = 0; s < p.steps; ++s) {
          const std::uint16_t* wh = p.tile(t, 0, s);
          const std::uint16_t* wl = p.tile(t, 1, s);
          for (int k = 0; k < kStep; ++k) {
            const std::size_t at = static_cast<std::size_t>((k / 2) * 32 + n * 2 + k % 2);
            const std::size_t j = static_cast<std::size_t>(s) * kStep + static_cast<std::size_t>(k);
            acc += bf16_value(xh[j]) * bf16_value(wh[at]) + bf16_value(xl[j]) * bf16_value(wh[at]) +
                   bf16_value(xh[j]) * bf16_value(wl[at]);
          }
        }
        y[static_cast<std::size_t>(m) * static_cast<std::size_t>(ldy) +
          static_cast<std::size_t>(r)] = acc;
      }
    }
  }
#if RELOKV_ENGINE_AMX
  if (tiles) _tile_release();
#endif
}

}  // namespace relokv_engine
