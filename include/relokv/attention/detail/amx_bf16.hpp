#pragma once
/// @file
/// Prefill attention over bf16 KV on AMX tiles (TDPBF16PS), where the build targets AMX-BF16
/// and the kernel grants the tile registers (Linux arch_prctl). Per tile of 16 query rows of
/// one query head, over the sequence's keys in tiles of 16: every score once, each row's
/// largest, the weights e^(s - max), then P.V accumulated in four tile registers across all
/// keys, so the accumulators are never rescaled (no online correction).
///
/// Precision: queries, rotated keys and softmax weights are each split into two bf16 terms,
/// hi + lo (~16 significant bits); Q.K takes Qhi Khi + Qhi Klo + Qlo Khi, P.V takes
/// Phi V + Plo V (V is bf16 in storage, exact), all accumulated in fp32: close to the fp32
/// kernels (relative error ~2^-16 a product), not bf16's 2^-9.
///
/// Also the tiles' shared pieces for other AMX code (the reference engine's products):
/// granted(), configure(), split_pairs().
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "relokv/attention/detail/kernel_common.hpp"
#include "relokv/attention/detail/simd.hpp"
#include "relokv/attention/detail/simd_f32.hpp"
#include "relokv/block_table.hpp"
#include "relokv/config.hpp"

// GCC spells the targets' macros __AMX_TILE__ and __AMX_BF16__, clang __AMXTILE__ and
// __AMXBF16__.
#if (defined(__AMX_TILE__) || defined(__AMXTILE__)) && \
    (defined(__AMX_BF16__) || defined(__AMXBF16__))
#define RELOKV_TARGET_AMX_BF16 1
#else
#define RELOKV_TARGET_AMX_BF16 0
#endif

#if RELOKV_HOST_SIMD && RELOKV_TARGET_AMX_BF16 && defined(__AVX512BF16__) && \
    defined(__AVX512BW__) && defined(__linux__) && !defined(RELOKV_NO_AMX)
#define RELOKV_HOST_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define RELOKV_HOST_AMX 0
#endif

// GCC 12 reports a false -Wuninitialized inside its AVX-512 intrinsics (their
// _mm512_undefined_* operands, GCC bug 105593) where these kernels inline them.
#if RELOKV_HOST_AMX && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

RELOKV_NAMESPACE_BEGIN
namespace detail::amx {

/// The process-wide switch (tests and benchmarks compare the AMX kernels with the others).
inline std::atomic<bool>& switched_on() {
  static std::atomic<bool> on{true};
  return on;
}

#if RELOKV_HOST_AMX

/// Whether the kernel lends this process AMX's tile registers (asked once).
inline bool granted() noexcept {
  static const bool ok = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

/// Whether the AMX kernels run: built for, granted, and switched on.
inline bool enabled() noexcept {
  return switched_on().load(std::memory_order_relaxed) && granted();
}

/// Palette 1 with all eight tiles at 16 rows of 64 bytes, on the calling thread.
inline void configure() noexcept {
  struct alignas(64) config {
    std::uint8_t palette = 1, start_row = 0;
    std::uint8_t reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
  } c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
}

/// One cache line of bf16: tile rows that straddle two lines slow the products (relokv_amx_rates).
struct alignas(64) line {
  std::uint16_t v[32];
};

/// x (16 floats) as bf16 hi (rounded to nearest even) and lo = bf16(x - hi).
RELOKV_ALWAYS_INLINE inline void split16(__m512 x, __m256i& hi, __m256i& lo) {
  hi = std::bit_cast<__m256i>(_mm512_cvtneps_pbh(x));
  const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
  lo = std::bit_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_sub_ps(x, hf)));
}

/// 16 rows of 32 floats (x, rows ld floats apart; rows from `live` on read as zeros) as the
/// right-hand tiles of one step: hi and lo, each [16 pairs][16 rows][2] bf16 (a row's 16 bf16
/// pairs become a column; a 16 x 16 transpose of 32-bit pairs in registers).
inline void split_pairs(const float* x, std::size_t ld, int live, std::uint16_t* hi,
                        std::uint16_t* lo) {
  __m512i h[16], l[16];
  for (int n = 0; n < 16; ++n) {
    __m512 x0 = _mm512_setzero_ps(), x1 = _mm512_setzero_ps();
    if (n < live) {
      x0 = _mm512_loadu_ps(x + static_cast<std::size_t>(n) * ld);
      x1 = _mm512_loadu_ps(x + static_cast<std::size_t>(n) * ld + 16);
    }
    __m256i h0, l0, h1, l1;
    split16(x0, h0, l0);
    split16(x1, h1, l1);
    h[n] = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
    l[n] = _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1);
  }
  const auto transpose_store = [](__m512i* r, std::uint16_t* dst) {
    __m512i a[16], b[16];
    for (int g = 0; g < 4; ++g) {  // 4 x 4 transposes inside each 128-bit lane
      a[4 * g + 0] = _mm512_unpacklo_epi32(r[4 * g], r[4 * g + 1]);
      a[4 * g + 1] = _mm512_unpackhi_epi32(r[4 * g], r[4 * g + 1]);
      a[4 * g + 2] = _mm512_unpacklo_epi32(r[4 * g + 2], r[4 * g + 3]);
      a[4 * g + 3] = _mm512_unpackhi_epi32(r[4 * g + 2], r[4 * g + 3]);
      b[4 * g + 0] = _mm512_unpacklo_epi64(a[4 * g], a[4 * g + 2]);
      b[4 * g + 1] = _mm512_unpackhi_epi64(a[4 * g], a[4 * g + 2]);
      b[4 * g + 2] = _mm512_unpacklo_epi64(a[4 * g + 1], a[4 * g + 3]);
      b[4 * g + 3] = _mm512_unpackhi_epi64(a[4 * g + 1], a[4 * g + 3]);
    }
    for (int c = 0; c < 4; ++c) {  // then the lanes across the four row groups
      const __m512i p0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44);
      const __m512i p1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xEE);
      const __m512i q0 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44);
      const __m512i q1 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xEE);
      _mm512_store_si512(dst + 32 * c, _mm512_shuffle_i32x4(p0, q0, 0x88));
      _mm512_store_si512(dst + 32 * (4 + c), _mm512_shuffle_i32x4(p0, q0, 0xDD));
      _mm512_store_si512(dst + 32 * (8 + c), _mm512_shuffle_i32x4(p1, q1, 0x88));
      _mm512_store_si512(dst + 32 * (12 + c), _mm512_shuffle_i32x4(p1, q1, 0xDD));
    }
  };
  transpose_store(h, hi);
  transpose_store(l, lo);
}

/// Whether prefill over bf16 KV with head_dim D runs here.
inline bool usable(int D) noexcept { return (D == 64 || D == 128 || D == 256) && enabled(); }

/// The keys and values of one prefill call, per KV head and tile of 16 key slots, in the
/// tiles' layout, and the queries split once per call.
struct attention_tiles {
  std::vector<line> kv;    ///< per head and key tile: K hi/lo per step, then V per 16 dims
  std::vector<line> q;     ///< [query head][padded queries][hi | lo][head_dim] bf16
  std::vector<pos_t> pos;  ///< per key tile: the position of its first slot
  std::vector<int> count;  ///< per key tile: slots holding keys (the rest are zeros)
  int heads = 0, nq_pad = 0, D = 0;
  [[nodiscard]] std::size_t lines_per_tile() const noexcept {
    return static_cast<std::size_t>(D / 32 * 2 + D / 16) * 16;
  }
  /// Key tile k of head h (counted from the call's first head).
  [[nodiscard]] line* tile(int h, std::size_t k) noexcept {
    return kv.data() +
           (k * static_cast<std::size_t>(heads) + static_cast<std::size_t>(h)) * lines_per_tile();
  }
  /// Appends key tile k (its slots from position pos0, count of them live); returns k.
  std::size_t add_tile(pos_t pos0, int live) {
    pos.push_back(pos0);
    count.push_back(live);
    const std::size_t need = pos.size() * static_cast<std::size_t>(heads) * lines_per_tile();
    if (kv.size() < need) kv.resize(std::max(need, 2 * kv.size()));  // never shrinks: no re-zeroing
    return pos.size() - 1;
  }
};

inline attention_tiles& tiles_scratch() {
  thread_local attention_tiles t;
  return t;
}

/// Key tile (16 slots from j0 of a block-head, vc of them live) of head h into its slot of t:
/// K (rotated as the placement wants, by key_rows) as hi and lo per 32 dimensions, V as 16
/// key pairs per 16 dimensions, the pairs written twice (rows 8-15 repeat rows 0-7), so that
/// one TDPBF16PS multiplies [P hi | P lo] by them.
template <int DC, class P>
void pack_key_tile(const block_head_t<bf16>& bh, int j0, int vc, attention_scratch& w, line* dst) {
  constexpr int D = 16 * DC;
  const float* kf = key_rows<DC, P>(bh, j0, vc, w);
  for (int s = 0; s < D / 32; ++s)
    split_pairs(kf + 32 * s, D, vc, dst[(2 * s) * 16].v, dst[(2 * s + 1) * 16].v);
  line* vdst = dst + (D / 32) * 2 * 16;
  const auto* vs = reinterpret_cast<const std::uint16_t*>(bh.vt) + static_cast<std::size_t>(j0) * D;
  for (int c = 0; c < D / 16; ++c)
    for (int kp = 0; kp < 8; ++kp) {
      __m512i pair = _mm512_setzero_si512();
      const int j = 2 * kp;
      if (j < vc) {
        const __m512i a = _mm512_cvtepu16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vs + j * D + 16 * c)));
        __m512i b = _mm512_setzero_si512();
        if (j + 1 < vc)
          b = _mm512_cvtepu16_epi32(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vs + (j + 1) * D + 16 * c)));
        pair = _mm512_or_si512(a, _mm512_slli_epi32(b, 16));
      }
      _mm512_store_si512(vdst[c * 16 + kp].v, pair);
      _mm512_store_si512(vdst[c * 16 + kp + 8].v, pair);
    }
}

/// Splits the scaled, rotated queries (qrot: [nq][hq][D]) of heads [h_begin, h_end) into t.q.
inline void split_queries(attention_tiles& t, const float* qrot, int nq, int hq, int G, int D,
                          int h_begin, int h_end) {
  t.D = D;
  t.heads = h_end - h_begin;
  t.pos.clear();
  t.count.clear();
  t.nq_pad = (nq + 15) / 16 * 16;
  const auto row = static_cast<std::size_t>(2 * D);
  const std::size_t need =
      static_cast<std::size_t>(t.heads * G) * static_cast<std::size_t>(t.nq_pad) * row / 32;
  if (t.q.size() < need) t.q.resize(need);
  auto* base = reinterpret_cast<std::uint16_t*>(t.q.data());  // offsets cross lines
  for (int qh = 0; qh < t.heads * G; ++qh)
    for (int qi = 0; qi < t.nq_pad; ++qi) {
      std::uint16_t* dst = base + (static_cast<std::size_t>(qh) * t.nq_pad + qi) * row;
      const float* src = qrot + (static_cast<std::size_t>(qi) * hq + h_begin * G + qh) * D;
      for (int d = 0; d < D; d += 16) {
        __m256i hi = _mm256_setzero_si256(), lo = _mm256_setzero_si256();
        if (qi < nq) split16(_mm512_loadu_ps(src + d), hi, lo);
        _mm256_store_si256(reinterpret_cast<__m256i*>(dst + d), hi);
        _mm256_store_si256(reinterpret_cast<__m256i*>(dst + D + d), lo);
      }
    }
}

/// S of 16 query rows (a: their hi rows, lo D further, rows 2D apart) with up to four key
/// tiles k[0..n) into tmm0-3, then into s (1 KiB each): Qhi Khi + Qhi Klo + Qlo Khi per 32
/// dimensions, the query tiles loaded once for the four.
template <int N>
RELOKV_ALWAYS_INLINE inline void scores(const std::uint16_t* a, int D, const line* const* k,
                                        float* s) {
  const std::size_t lda = static_cast<std::size_t>(2 * D) * sizeof(std::uint16_t);
  _tile_zero(0);
  if constexpr (N > 1) _tile_zero(1);
  if constexpr (N > 2) _tile_zero(2);
  if constexpr (N > 3) _tile_zero(3);
  for (int st = 0; st < D / 32; ++st) {
    _tile_loadd(4, a + 32 * st, lda);
    _tile_loadd(5, a + D + 32 * st, lda);
// The tile intrinsics take their register numbers as literals (GCC pastes them into asm).
#define RELOKV_AMX_SCORE(C)                      \
  _tile_loadd(6, k[C][(2 * st) * 16].v, 64);     \
  _tile_dpbf16ps(C, 4, 6);                       \
  _tile_loadd(7, k[C][(2 * st + 1) * 16].v, 64); \
  _tile_dpbf16ps(C, 5, 6);                       \
  _tile_dpbf16ps(C, 4, 7)
    RELOKV_AMX_SCORE(0);
    if constexpr (N > 1) {
      RELOKV_AMX_SCORE(1);
    }
    if constexpr (N > 2) {
      RELOKV_AMX_SCORE(2);
    }
    if constexpr (N > 3) {
      RELOKV_AMX_SCORE(3);
    }
#undef RELOKV_AMX_SCORE
  }
  _tile_stored(0, s, 64);
  if constexpr (N > 1) _tile_stored(1, s + 256, 64);
  if constexpr (N > 2) _tile_stored(2, s + 512, 64);
  if constexpr (N > 3) _tile_stored(3, s + 768, 64);
}

/// Scratch of one tile of query rows: its visible key tiles, their scores, their weights.
struct row_tile_scratch {
  std::vector<std::size_t> keys;
  struct alignas(64) scores_line {
    float v[16];
  };
  std::vector<scores_line> s;  ///< per visible key tile: 16 rows of 16 fp32 scores
  std::vector<line> p;         ///< per visible key tile: 16 rows of [P hi | P lo] bf16
};

/// Prefill attention of heads [h_begin, h_end) for queries at positions m (t.q split, key
/// tiles packed): per tile of 16 rows of one query head, all its scores (S for every visible
/// key tile), each row's maximum, the weights e^(s - max) split hi + lo, then P.V over the key
/// tiles in four accumulator tiles; acc ([nq][hq][D]) and the rows' softmax state st
/// ([nq][hq]: each row set whole, one pass over all its scores) as attend_group's output loop
/// reads them.
inline void attend(attention_tiles& t, const pos_t* m, int nq, int hq, int G, int h_begin,
                   float* acc, const softmax_rows& st, std::int32_t window = 0) {
  const int D = t.D;
  const std::size_t ntiles = t.pos.size();
  thread_local row_tile_scratch rs;
  if (rs.s.size() < ntiles * 16) {
    rs.s.resize(ntiles * 16);
    rs.p.resize(ntiles * 16);
  }
  configure();
  alignas(64) float obuf[16 * 64];
  for (int qh = 0; qh < t.heads * G; ++qh) {
    const int h = qh / G;  // the KV head, counted from h_begin
    const int head = h_begin * G + qh;
    for (int q0 = 0; q0 < nq; q0 += 16) {
      const int rows = std::min(16, nq - q0);
      const std::uint16_t* a = reinterpret_cast<const std::uint16_t*>(t.q.data()) +
                               (static_cast<std::size_t>(qh) * t.nq_pad + q0) * 2 * D;
      pos_t mhi = m[q0];
      for (int r = 1; r < rows; ++r) mhi = std::max(mhi, m[q0 + r]);
      rs.keys.clear();
      for (std::size_t k = 0; k < ntiles; ++k)
        if (t.pos[k] <= mhi) rs.keys.push_back(k);
      const std::size_t nk = rs.keys.size();
      float* sb = reinterpret_cast<float*>(rs.s.data());  // offsets cross lines
      for (std::size_t i = 0; i < nk; i += 4) {           // every score, four key tiles at a time
        const line* kt[4];
        for (std::size_t j = 0; j < 4 && i + j < nk; ++j) kt[j] = t.tile(h, rs.keys[i + j]);
        float* dst = sb + i * 256;
        switch (std::min<std::size_t>(4, nk - i)) {
          case 4:
            scores<4>(a, D, kt, dst);
            break;
          case 3:
            scores<3>(a, D, kt, dst);
            break;
          case 2:
            scores<2>(a, D, kt, dst);
            break;
          default:
            scores<1>(a, D, kt, dst);
        }
      }
      // The slots of key tile i that row r sees, as a lane mask: causal (slots up to m), and
      // inside a sliding window (slots past m - window). A window wider than the request
      // masks exactly what causality does: the same bits as no window.
      const auto seen = [&](std::size_t i, int r) -> __mmask16 {
        const std::size_t k = rs.keys[i];
        const std::int64_t v =
            std::clamp<std::int64_t>(std::int64_t{m[q0 + r]} - t.pos[k] + 1, 0, t.count[k]);
        const std::int64_t lo =
            window > 0
                ? std::clamp<std::int64_t>(std::int64_t{m[q0 + r]} - window + 1 - t.pos[k], 0, v)
                : 0;
        return static_cast<__mmask16>(((1u << v) - 1u) & ~((1u << lo) - 1u));
      };
      for (int r = 0; r < 16; ++r) {  // each row's maximum, then its weights
        __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
        if (r < rows)
          for (std::size_t i = 0; i < nk; ++i)
            vmax =
                _mm512_mask_max_ps(vmax, seen(i, r), vmax, _mm512_load_ps(sb + i * 256 + 16 * r));
        const float rmax = _mm512_reduce_max_ps(vmax);
        __m512 vsum = _mm512_setzero_ps();
        const __m512 vm = _mm512_set1_ps(rmax);
        for (std::size_t i = 0; i < nk; ++i) {
          const __mmask16 v = r < rows ? seen(i, r) : __mmask16{0};
          __m512 p = _mm512_setzero_ps();
          if (v != 0) {
            simd::vf16 x =
                std::bit_cast<simd::vf16>(_mm512_sub_ps(_mm512_load_ps(sb + i * 256 + 16 * r), vm));
            simd::exp_nonpositive(x);
            p = _mm512_maskz_mov_ps(v, std::bit_cast<__m512>(x));
            vsum = _mm512_add_ps(vsum, p);
          }
          __m256i hi, lo;
          split16(p, hi, lo);
          _mm512_store_si512(rs.p[i * 16 + static_cast<std::size_t>(r)].v,
                             _mm512_inserti64x4(_mm512_castsi256_si512(hi), lo, 1));
        }
        if (r < rows) {
          st.set(static_cast<std::size_t>(q0 + r) * hq + head, rmax, _mm512_reduce_add_ps(vsum));
        }
      }
      for (int d0 = 0; d0 < D; d0 += 64) {  // P.V, 64 dimensions (four tiles) at a time
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (std::size_t i = 0; i < nk; ++i) {
          const line* vt = t.tile(h, rs.keys[i]) + (D / 32) * 2 * 16 + (d0 / 16) * 16;
          _tile_loadd(4, rs.p[i * 16].v, 64);
          _tile_loadd(5, vt[0].v, 64);
          _tile_dpbf16ps(0, 4, 5);
          _tile_loadd(6, vt[16].v, 64);
          _tile_dpbf16ps(1, 4, 6);
          _tile_loadd(7, vt[32].v, 64);
          _tile_dpbf16ps(2, 4, 7);
          _tile_loadd(5, vt[48].v, 64);
          _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, obuf, 256);
        _tile_stored(1, obuf + 16, 256);
        _tile_stored(2, obuf + 32, 256);
        _tile_stored(3, obuf + 48, 256);
        for (int r = 0; r < rows; ++r) {
          float* out = acc + (static_cast<std::size_t>(q0 + r) * hq + head) * D + d0;
          for (int c = 0; c < 4; ++c)
            _mm512_storeu_ps(out + 16 * c, _mm512_load_ps(obuf + 64 * r + 16 * c));
        }
      }
    }
  }
  _tile_release();
}

#else

inline bool granted() noexcept { return false; }
inline bool enabled() noexcept { return false; }
inline bool usable(int) noexcept { return false; }

#endif  // RELOKV_HOST_AMX

}  // namespace detail::amx
RELOKV_NAMESPACE_END

#if RELOKV_HOST_AMX && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
