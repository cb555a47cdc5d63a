// The AVX-512 VNNI paired decode kernels (qgemm_paired.hpp). Compiled to nothing on hosts
// without AVX512_VBMI.
#include "qgemm_paired.hpp"
#include "qgemm_blocks.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace relokv_engine::detail {

// Per block of 32: scale(s), then the values (read by the AVX-512 kernels).
[[maybe_unused]] constexpr int kQ4_1Bytes = 20, kQ8_0Bytes = 34;

#if RELOKV_ENGINE_VNNI
// GCC 12 reports a false -Wmaybe-uninitialized (and -Wuninitialized) inside the AVX-512 insert,
// convert and reduce intrinsics (their _mm512_undefined_* operands, GCC bug 105593); the kernels
// below use them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#if RELOKV_ENGINE_PAIRED
constexpr int kQ5_0Bytes = 22;
// Rows of at most this many bytes are multiplied four at a time in decode.

// The paired kernels' tails (an odd last block): one row of Q4_1 or Q8_0 blocks against one
// row of Q8 activations.
// Q4_1: w = d * q + m (q in [0, 15]), so a block contributes d * dx * sum(q * xq) + m * s
// with s = dx * sum(xq). Q8_0: w = d * q (q in [-127, 127]).
float q4_1_dot(const std::uint8_t* w, const std::int8_t* x, const float* xd, const float* xs,
               int nb) {
  float acc = 0.0f;
  for (int b = 0; b < nb; ++b, w += kQ4_1Bytes, x += 32) {
    const std::uint8_t* q = w + 4;
    int s = 0;
    for (int j = 0; j < 16; ++j) s += (q[j] & 0xF) * x[j] + (q[j] >> 4) * x[j + 16];
    acc += fp16_at(w) * xd[b] * static_cast<float>(s) + fp16_at(w + 2) * xs[b];
  }
  return acc;
}
float q8_0_dot(const std::uint8_t* w, const std::int8_t* x, const float* xd, int nb) {
  float acc = 0.0f;
  for (int b = 0; b < nb; ++b, w += kQ8_0Bytes, x += 32) {
    const auto* q = reinterpret_cast<const std::int8_t*>(w + 2);
    int s = 0;
    for (int j = 0; j < 32; ++j) s += q[j] * x[j];
    acc += fp16_at(w) * xd[b] * static_cast<float>(s);
  }
  return acc;
}
// Q5_0: w = d * (q - 16), q = nibble + 16 * (its bit of qh); xs as for Q4_1.
float q5_0_dot(const std::uint8_t* w, const std::int8_t* x, const float* xd, const float* xs,
               int nb) {
  float acc = 0.0f;
  for (int b = 0; b < nb; ++b, w += kQ5_0Bytes, x += 32) {
    std::uint32_t qh = 0;
    std::memcpy(&qh, w + 2, 4);
    int s = 0;
    for (int j = 0; j < 16; ++j) {
      s += ((w[6 + j] & 0xF) | (((qh >> j) & 1u) << 4)) * x[j];
      s += ((w[6 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) * x[j + 16];
    }
    acc += fp16_at(w) * (xd[b] * static_cast<float>(s) - 16.0f * xs[b]);
  }
  return acc;
}

// Blocks b and b + 1 of a Q8_0 row (at a) as their 64 signed bytes.
inline __m512i q8_0_raw_pair(const std::uint8_t* a) {
  const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2));
  const __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + kQ8_0Bytes + 2));
  return _mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1);
}
inline __m512 pair_scale(float a, float b) {
  return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

// Byte indices for VPERMT2B over the 128 bytes at a group of four blocks (bit 6: the second
// 64 bytes): Q4_1's nibbles of blocks 0-3 side by side; Q4_1's four (d, m) pairs; Q8_0's four
// scales.
struct quad_tables {
  __m512i q4_1_nibbles, q4_1_scales, q8_0_scales;
  quad_tables() {
    alignas(64) std::uint8_t nib[64], s41[64] = {}, s80[64] = {};
    for (int k = 0; k < 4; ++k) {
      for (int j = 0; j < 16; ++j)
        nib[16 * k + j] = static_cast<std::uint8_t>(kQ4_1Bytes * k + 4 + j);
      for (int j = 0; j < 4; ++j) s41[4 * k + j] = static_cast<std::uint8_t>(kQ4_1Bytes * k + j);
      for (int j = 0; j < 2; ++j) s80[2 * k + j] = static_cast<std::uint8_t>(kQ8_0Bytes * k + j);
    }
    q4_1_nibbles = _mm512_load_si512(nib);
    q4_1_scales = _mm512_load_si512(s41);
    q8_0_scales = _mm512_load_si512(s80);
  }
};
// The kernels' constant tables, each built once (a kernel call is one row: building them
// there cost a fifth of a row).
template <class Tables>
const Tables& tables() {
  static const Tables t;
  return t;
}

// q8_activations::qp's sixteen-block groups from the plain int8 rows: output vector v (v / 2
// of the group's five, low nibbles' elements for even v) takes its bytes from the 128 bytes of
// four blocks starting at block `first`, through VPERMT2B, zeros where `keep` is clear.
struct q4_1_layout_tables {
  __m512i idx[10];
  __mmask64 keep[10];
  int first[10];
  q4_1_layout_tables() {
    for (int v = 0; v < 10; ++v) {
      alignas(64) std::uint8_t ix[64] = {};
      const int c = v / 2, half = v % 2;
      first[v] = 64 * c / kQ4_1Bytes;
      keep[v] = 0;
      for (int p = 0; p < 64; ++p) {
        const int at = 64 * c + p, blk = at / kQ4_1Bytes, off = at % kQ4_1Bytes;
        if (off < 4) continue;  // the block's scale and minimum
        ix[p] = static_cast<std::uint8_t>((blk - first[v]) * 32 + off - 4 + 16 * half);
        keep[v] |= __mmask64{1} << p;
      }
      idx[v] = _mm512_load_si512(ix);
    }
  }
};

// k blocks of 32 int8 (at src) in nibble order (at dst): each block's first 16, then each
// one's last 16, so that the low and high nibbles of k blocks' weights multiply as they lie.
// One block is as it was.
void nibble_order(const std::int8_t* src, std::size_t k, std::int8_t* dst) {
  for (std::size_t j = 0; j < k; ++j) {
    std::memcpy(dst + 16 * j, src + 32 * j, 16);
    std::memcpy(dst + 16 * (k + j), src + 32 * j + 16, 16);
  }
}

// q ([rows][width]) in Q4_1's order (rows_q4_1), `stride` bytes a row: per group of sixteen
// blocks, five vectors of the weights' bytes, each as two runs of 64: the elements against
// each byte's low nibbles, then its high nibbles, zeros against the blocks' scales; then
// nibble order by four blocks, by two, and an odd last block as it is.
void q4_1_order(const std::vector<std::int8_t>& q, std::int32_t rows, std::int32_t width,
                std::vector<std::int8_t>& out, std::size_t& stride) {
  const q4_1_layout_tables& t = tables<q4_1_layout_tables>();
  const auto nbk = static_cast<std::size_t>(width / 32);
  const std::size_t groups = nbk / 16, rest = nbk - groups * 16;
  stride = groups * 640 + rest * 32;
  out.resize(static_cast<std::size_t>(rows) * stride);
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
    const std::int8_t* src = q.data() + r * static_cast<std::size_t>(width);
    std::int8_t* dst = out.data() + r * stride;
    for (std::size_t g = 0; g < groups; ++g, src += 16 * 32, dst += 640)
      for (int v = 0; v < 10; ++v) {  // vector v / 2's low (even v) or high nibbles' elements
        const std::int8_t* from = src + static_cast<std::size_t>(t.first[v]) * 32;
        _mm512_storeu_si512(
            dst + static_cast<std::size_t>(v) * 64,
            _mm512_maskz_permutex2var_epi8(t.keep[v], _mm512_loadu_si512(from), t.idx[v],
                                           _mm512_loadu_si512(from + 64)));
      }
    std::size_t b = 0;
    for (; b + 4 <= rest; b += 4) nibble_order(src + b * 32, 4, dst + b * 32);
    for (; b + 2 <= rest; b += 2) nibble_order(src + b * 32, 2, dst + b * 32);
    if (b < rest) nibble_order(src + b * 32, 1, dst + b * 32);
  }
}

#if RELOKV_ENGINE_Q5_0
// q in Q5_0's order (rows_q5_0): nibble order by four blocks; the blocks after the last
// group as they are.
void q5_0_order(const std::vector<std::int8_t>& q, std::int32_t rows, std::int32_t width,
                std::vector<std::int8_t>& out) {
  const auto nbk = static_cast<std::size_t>(width / 32);
  out = q;
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r)
    for (std::size_t b = 0; b + 4 <= nbk; b += 4) {
      const std::size_t at = r * static_cast<std::size_t>(width) + b * 32;
      nibble_order(q.data() + at, 4, out.data() + at);
    }
}
#endif

// Each of the paired kernels takes W weight rows against R activation rows (W = 4, R = 1 in
// decode: four rows share the constants, the row loop's overheads and one reduction, and
// their sums are four independent chains; W = 1 elsewhere) and writes out[k * R + r].
//
// The four sums of a, b, c, e at once: lane k of the result is the sum of the k-th's lanes.
inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 e) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 ce = _mm512_add_ps(_mm512_unpacklo_ps(c, e), _mm512_unpackhi_ps(c, e));
  const __m512 abce = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(ce))),
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(ce))));
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(abce), _mm512_extractf32x8_ps(abce, 1));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}
/// One vector's sum in hsum4's order, bit for bit: a decode row alone (four weight rows at a
/// time, reduced by hsum4) and the same row in a batch (one weight row at a time) must give
/// the same bits (docs/server.md, "Answers that do not depend on the load").
/// _mm512_reduce_add_ps adds across the 128-bit lanes first, hsum4 within them first: on
/// AVX-512 hosts the two disagreed in the last bits, and a request's answer changed with the
/// load.
inline float hsum(__m512 v) { return _mm_cvtss_f32(hsum4(v, v, v, v)); }
template <int W, int R>
void reduce_rows(const __m512 (&acc)[W][R], const float (&tail)[W][R], float* out) {
  if constexpr (W == 4 && R == 1) {
    alignas(16) float s[4];
    _mm_store_ps(s, hsum4(acc[0][0], acc[1][0], acc[2][0], acc[3][0]));
    for (int k = 0; k < 4; ++k) out[k] = s[k] + tail[k][0];
  } else {
    for (int k = 0; k < W; ++k)
      for (int r = 0; r < R; ++r) out[k * R + r] = hsum(acc[k][r]) + tail[k][r];
  }
}

// The sums of a kernel whose weights are w = d * (u - offset), u unsigned (Q8_0 as q + 128,
// Q5_0), for W weight rows against R activation rows: the scaled integer sums in acc, each
// block's d * s (s = dx * the sum of its activations) in ds4 for the offset's term, and what
// the reference loops add in tail. `layout` is the activations' byte order the kernel reads.
template <int W, int R>
struct offset_sums {
  const q8_activations& xq;
  const std::int8_t* layout;
  int i0;
  std::size_t nbk;
  __m512 acc[W][R];
  __m128 ds4[W][R];
  float tail[W][R];
  offset_sums(const q8_activations& x, const std::int8_t* bytes, int first)
      : xq(x), layout(bytes), i0(first), nbk(static_cast<std::size_t>(x.cols / 32)) {
    for (int k = 0; k < W; ++k)
      for (int r = 0; r < R; ++r) {
        acc[k][r] = _mm512_setzero_ps();
        ds4[k][r] = _mm_setzero_ps();
        tail[k][r] = 0.0f;
      }
  }
  /// Activation row r's block b: its index among the scales, its bytes in `layout` or in q.
  std::size_t at(int r, int b) const {
    return static_cast<std::size_t>(i0 + r) * nbk + static_cast<std::size_t>(b);
  }
  const std::int8_t* bytes(const std::int8_t* base, int r, int b) const {
    return base + static_cast<std::size_t>(i0 + r) * static_cast<std::size_t>(xq.cols) +
           static_cast<std::size_t>(b) * 32;
  }
  const std::int8_t* x(int r, int b) const { return bytes(layout, r, b); }
  /// Four blocks' d (d4) against activation row r from block b: their d * dx, and d * s added
  /// to the offset's term.
  __m128 scales(__m128 d4, int k, int r, int b) {
    ds4[k][r] = _mm_fmadd_ps(d4, _mm_loadu_ps(xq.s.data() + at(r, b)), ds4[k][r]);
    return _mm_mul_ps(d4, _mm_loadu_ps(xq.d.data() + at(r, b)));
  }
  void finish(float offset, float* out) {
    for (int k = 0; k < W; ++k)
      for (int r = 0; r < R; ++r) {
        alignas(16) float e[4];
        _mm_store_ps(e, ds4[k][r]);
        tail[k][r] -= offset * ((e[0] + e[1]) + (e[2] + e[3]));
      }
    reduce_rows<W, R>(acc, tail, out);
  }
};

// Q8_0: each block pair of a row is unpacked once and multiplied with every activation row
// (VPDPBUSD: 64 u8 x s8 products into 16 int32 lanes, lanes 0-7 of the first block, 8-15 of
// the second), scaled per block in fp32. Four blocks at a time share one gather of their
// scales (VPERMT2B) and one conversion.
template <int W, int R>
void rows_q8_0(const std::uint8_t* const* w, int nb, const q8_activations& xq, int i0, float* out) {
  const __m512i sc_idx = tables<quad_tables>().q8_0_scales;
  // lanes 0-7: scale 0 (or 2), 8-15: scale 1 (or 3)
  const __m512i lo_pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i hi_pair = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  offset_sums<W, R> sums(xq, xq.q.data(), i0);
  int b = 0;
  for (; b + 4 <= nb; b += 4)
    for (int k = 0; k < W; ++k) {
      const std::uint8_t* A = w[k] + b * kQ8_0Bytes;
      prefetch_ahead(A, 4 * kQ8_0Bytes);
      const __m512i z0 = _mm512_loadu_si512(A);
      const __m512i z1 = _mm512_loadu_si512(A + 64);  // the scales reach byte 103 of 136
      const __m128 d4 =
          _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi8(z0, sc_idx, z1)));
      const __m512i w01 = _mm512_xor_si512(q8_0_raw_pair(A), bias);
      const __m512i w23 = _mm512_xor_si512(q8_0_raw_pair(A + 2 * kQ8_0Bytes), bias);
      for (int r = 0; r < R; ++r) {
        const __m512 s512 = _mm512_castps128_ps512(sums.scales(d4, k, r, b));
        const __m512i dp01 =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), w01, _mm512_loadu_si512(sums.x(r, b)));
        const __m512i dp23 =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), w23, _mm512_loadu_si512(sums.x(r, b) + 64));
        __m512& acc = sums.acc[k][r];
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp01), _mm512_permutexvar_ps(lo_pair, s512), acc);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp23), _mm512_permutexvar_ps(hi_pair, s512), acc);
      }
    }
  for (; b + 2 <= nb; b += 2)
    for (int k = 0; k < W; ++k) {
      const std::uint8_t* A = w[k] + b * kQ8_0Bytes;
      prefetch_ahead(A, 2 * kQ8_0Bytes);
      const __m512i wv = _mm512_xor_si512(q8_0_raw_pair(A), bias);
      const float da = fp16_at(A), db = fp16_at(A + kQ8_0Bytes);
      for (int r = 0; r < R; ++r) {
        const float* xd = xq.d.data() + sums.at(r, b);
        const float* xs = xq.s.data() + sums.at(r, b);
        const __m512i dp =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, _mm512_loadu_si512(sums.x(r, b)));
        sums.acc[k][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), pair_scale(da * xd[0], db * xd[1]),
                                         sums.acc[k][r]);
        sums.tail[k][r] -= 128.0f * (da * xs[0] + db * xs[1]);
      }
    }
  if (b < nb)  // an odd block count: the last block by the reference loop
    for (int k = 0; k < W; ++k)
      for (int r = 0; r < R; ++r)
        sums.tail[k][r] +=
            q8_0_dot(w[k] + b * kQ8_0Bytes, sums.x(r, b), xq.d.data() + sums.at(r, b), 1);
  sums.finish(128.0f, out);
}

// Q4_1 sixteen blocks (320 bytes, five vectors) at a time, the bytes multiplied as they lie:
// each block is five 4-byte lanes, its scale and minimum then its nibbles, so every lane of
// VPDPBUSD's sums belongs to one block, and the activations (q8_activations::qp) hold zeros
// against the scale lanes and each block's elements against its nibbles. The sixteen (d, m)
// lanes are gathered by three permutes and converted in two instructions.
struct q4_1_group_tables {
  __m512i heads[3];   // VPERMT2D / VPERMD indices gathering the (d, m) lanes
  __m512i spread[5];  // per vector: VPERMT2PS indices of its lanes' d * dx
  q4_1_group_tables() {
    alignas(64) std::int32_t h[3][16] = {}, sp[5][16];
    for (int k = 0; k < 16; ++k) {
      const int lane = 5 * k;  // block k's (d, m) among the group's 80 lanes
      h[k < 7 ? 0 : k < 13 ? 1 : 2][k] = k < 7 ? lane : k < 13 ? lane - 32 : lane - 64;
    }
    for (int v = 0; v < 5; ++v)
      for (int l = 0; l < 16; ++l) {
        const int k = (16 * v + l) / 5;
        sp[v][l] = k < 8 ? 2 * k : 16 + 2 * (k - 8);
      }
    for (int t = 0; t < 3; ++t) heads[t] = _mm512_load_si512(h[t]);
    for (int v = 0; v < 5; ++v) spread[v] = _mm512_load_si512(sp[v]);
  }
};

// Q4_1 against activations laid out for it (q8_activations::qp, ::ds): groups of sixteen
// blocks as above; then per group of four blocks, one VPERMT2B gathers their nibbles (the
// activations were put in nibble order once, so the low and high nibbles multiply as they
// lie) and another their scales and minimums, which one instruction converts and another
// multiplies by the activations' scales and sums. A remaining pair of blocks is taken the same
// way from its two 16-byte runs.
template <int W, int R>
void rows_q4_1(const std::uint8_t* const* w, int nb, const q8_activations& xq, int i0, float* out) {
  const q4_1_group_tables& tab = tables<q4_1_group_tables>();
  const auto nbk = static_cast<std::size_t>(xq.cols / 32);
  const __m512i nib_idx = tables<quad_tables>().q4_1_nibbles;
  const __m512i dm_idx = tables<quad_tables>().q4_1_scales;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  // lanes 4k..4k+3 take block k's d * dx (element 2k of the products)
  const __m512i spread4 = _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0);
  // a pair: lanes 0-3 and 8-11 hold block a's sums, 4-7 and 12-15 block b's
  const __m512i spread = _mm512_set_epi32(2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0);
  __m512 acc[W][R];
  __m512 extra[W][R];  // odd lanes: the minimums' terms
  float tail[W][R];
  for (int k = 0; k < W; ++k)
    for (int r = 0; r < R; ++r) {
      acc[k][r] = _mm512_setzero_ps();
      extra[k][r] = _mm512_setzero_ps();
      tail[k][r] = 0.0f;
    }
  const auto xrow = [&](int r) {
    return xq.qp.data() + static_cast<std::size_t>(i0 + r) * xq.qp_stride;
  };
  const auto dsrow = [&](int r, int b) {
    return xq.ds.data() +
           (static_cast<std::size_t>(i0 + r) * nbk + static_cast<std::size_t>(b)) * 2;
  };
  int b = 0;
  for (; b + 16 <= nb; b += 16)
    for (int k = 0; k < W; ++k) {
      const std::uint8_t* A = w[k] + b * kQ4_1Bytes;
      prefetch_ahead(A, 16 * kQ4_1Bytes);
      __m512i v[5];
#pragma GCC unroll 5
      for (int j = 0; j < 5; ++j) v[j] = _mm512_loadu_si512(A + 64 * j);
      __m512i h = _mm512_permutex2var_epi32(v[0], tab.heads[0], v[1]);
      h = _mm512_mask_blend_epi32(0x1F80, h, _mm512_permutex2var_epi32(v[2], tab.heads[1], v[3]));
      h = _mm512_mask_permutexvar_epi32(h, 0xE000, tab.heads[2], v[4]);
      const __m512 dm0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));        // blocks 0-7
      const __m512 dm1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));  // blocks 8-15
      for (int r = 0; r < R; ++r) {
        const std::int8_t* x = xrow(r) + static_cast<std::size_t>(b / 16) * 640;
        const __m512 p0 = _mm512_mul_ps(dm0, _mm512_loadu_ps(dsrow(r, b)));
        const __m512 p1 = _mm512_mul_ps(dm1, _mm512_loadu_ps(dsrow(r, b) + 16));
        extra[k][r] = _mm512_add_ps(extra[k][r], _mm512_add_ps(p0, p1));
#pragma GCC unroll 5
        for (int j = 0; j < 5; ++j) {
          const __m512i lo = _mm512_and_si512(v[j], m4);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v[j], 4), m4);
          const __m512i dp = _mm512_dpbusd_epi32(
              _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(x + 128 * j)), hi,
              _mm512_loadu_si512(x + 128 * j + 64));
          acc[k][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp),
                                      _mm512_permutex2var_ps(p0, tab.spread[j], p1), acc[k][r]);
        }
      }
    }
  const int grouped = b;  // blocks before the four-block layout starts
  const auto xat = [&](int r, int blk) {
    return xrow(r) + static_cast<std::size_t>(grouped / 16) * 640 +
           static_cast<std::size_t>(blk - grouped) * 32;
  };
  for (; b + 4 <= nb; b += 4)
    for (int k = 0; k < W; ++k) {
      const std::uint8_t* A = w[k] + b * kQ4_1Bytes;
      prefetch_ahead(A, 4 * kQ4_1Bytes);
      const __m512i z0 = _mm512_loadu_si512(A);
      const __m512i z1 =
          _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(A + 64)));
      const __m512i nib = _mm512_permutex2var_epi8(z0, nib_idx, z1);
      const __m512i wlo = _mm512_and_si512(nib, m4);
      const __m512i whi = _mm512_and_si512(_mm512_srli_epi16(nib, 4), m4);
      const __m256 dm =
          _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi8(z0, dm_idx, z1)));
      for (int r = 0; r < R; ++r) {
        const std::int8_t* x = xat(r, b);
        const __m256 prod = _mm256_mul_ps(dm, _mm256_loadu_ps(dsrow(r, b)));
        extra[k][r] = _mm512_add_ps(extra[k][r], _mm512_zextps256_ps512(prod));
        const __m512i dp = _mm512_dpbusd_epi32(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), wlo, _mm512_loadu_si512(x)), whi,
            _mm512_loadu_si512(x + 64));
        acc[k][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp),
                                    _mm512_permutexvar_ps(spread4, _mm512_castps256_ps512(prod)),
                                    acc[k][r]);
      }
    }
  for (; b + 2 <= nb; b += 2)
    for (int k = 0; k < W; ++k) {
      const std::uint8_t* A = w[k] + b * kQ4_1Bytes;
      prefetch_ahead(A, 2 * kQ4_1Bytes);
      const std::uint8_t* B = A + kQ4_1Bytes;
      const __m256i q = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(A + 4))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(B + 4)), 1);
      const __m512i wv = _mm512_and_si512(
          _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), m4);
      std::int32_t sa, sb;
      std::memcpy(&sa, A, 4);
      std::memcpy(&sb, B, 4);
      const __m128 dm = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(sa), sb, 1));
      for (int r = 0; r < R; ++r) {
        const __m128 prod = _mm_mul_ps(dm, _mm_loadu_ps(dsrow(r, b)));
        extra[k][r] = _mm512_add_ps(extra[k][r], _mm512_zextps128_ps512(prod));
        const __m512i dp =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, _mm512_loadu_si512(xat(r, b)));
        acc[k][r] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp),
                            _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(prod)), acc[k][r]);
      }
    }
  for (int k = 0; k < W; ++k)
    for (int r = 0; r < R; ++r) {
      const std::size_t i = static_cast<std::size_t>(i0 + r);
      if (b < nb) {  // an odd block count: the last block by the reference loop
        const std::int8_t* x =
            xq.q.data() + i * static_cast<std::size_t>(xq.cols) + static_cast<std::size_t>(b) * 32;
        tail[k][r] = q4_1_dot(w[k] + b * kQ4_1Bytes, x, xq.d.data() + i * nbk + b,
                              xq.s.data() + i * nbk + b, 1);
      }
      // the minimums' terms (odd lanes) join the sums before one reduction
      acc[k][r] = _mm512_mask_add_ps(acc[k][r], 0xAAAA, acc[k][r], extra[k][r]);
    }
  reduce_rows<W, R>(acc, tail, out);
}

#if RELOKV_ENGINE_Q5_0
// Q5_0 (w = d * (q - 16), q = nibble + 16 * its bit of qh), four blocks (88 bytes) a step
// against activations in the four-block nibble order (q8_activations::qq): one VPERMT2B
// gathers the nibbles, another each block's qh into the two 64-bit lanes that hold its
// elements, and VPSHUFBITQMB (AVX512_BITALG) turns each element's bit into a byte mask that
// adds 16 where it is set. The offset is -16 d times the activations' block sums.
struct q5_0_tables {
  __m512i nibbles, qh, bits_lo, bits_hi, scales;
  q5_0_tables() {
    alignas(64) std::uint8_t nib[64], qh_at[64], lo[64], hi[64], sc[64] = {};
    for (int k = 0; k < 4; ++k) {
      for (int j = 0; j < 16; ++j)
        nib[16 * k + j] = static_cast<std::uint8_t>(kQ5_0Bytes * k + 6 + j);
      for (int j = 0; j < 2; ++j) sc[2 * k + j] = static_cast<std::uint8_t>(kQ5_0Bytes * k + j);
    }
    for (int q = 0; q < 8; ++q)  // 64-bit lane q: elements 8 * (q % 2) .. + 7 of block q / 2
      for (int i = 0; i < 8; ++i) {
        qh_at[8 * q + i] = static_cast<std::uint8_t>(kQ5_0Bytes * (q / 2) + 2 + i % 4);
        lo[8 * q + i] = static_cast<std::uint8_t>(8 * (q % 2) + i);
        hi[8 * q + i] = static_cast<std::uint8_t>(16 + 8 * (q % 2) + i);
      }
    nibbles = _mm512_load_si512(nib);
    qh = _mm512_load_si512(qh_at);
    bits_lo = _mm512_load_si512(lo);
    bits_hi = _mm512_load_si512(hi);
    scales = _mm512_load_si512(sc);
  }
};

template <int W, int R>
void rows_q5_0(const std::uint8_t* const* w, int nb, const q8_activations& xq, int i0, float* out) {
  const q5_0_tables& tab = tables<q5_0_tables>();
  const __m512i m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
  // lanes 4k..4k+3 take block k's d * dx
  const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  offset_sums<W, R> sums(xq, xq.qq.data(), i0);
  int b = 0;
  for (; b + 4 <= nb; b += 4)
    for (int k = 0; k < W; ++k) {
      const std::uint8_t* A = w[k] + b * kQ5_0Bytes;
      prefetch_ahead(A, 4 * kQ5_0Bytes);
      const __m512i z0 = _mm512_loadu_si512(A);
      const __m512i z1 = _mm512_maskz_loadu_epi8(0xFFFFFF, A + 64);  // the step's last 24 bytes
      const __m512i nib = _mm512_permutex2var_epi8(z0, tab.nibbles, z1);
      const __m512i qh = _mm512_permutex2var_epi8(z0, tab.qh, z1);
      const __m512i lon = _mm512_and_si512(nib, m4);
      const __m512i lo =
          _mm512_mask_add_epi8(lon, _mm512_bitshuffle_epi64_mask(qh, tab.bits_lo), lon, sixteen);
      const __m512i hin = _mm512_and_si512(_mm512_srli_epi16(nib, 4), m4);
      const __m512i hi =
          _mm512_mask_add_epi8(hin, _mm512_bitshuffle_epi64_mask(qh, tab.bits_hi), hin, sixteen);
      const __m128 d4 =
          _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi8(z0, tab.scales, z1)));
      for (int r = 0; r < R; ++r) {
        const __m512 sc = _mm512_castps128_ps512(sums.scales(d4, k, r, b));
        const __m512i dp = _mm512_dpbusd_epi32(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(sums.x(r, b))), hi,
            _mm512_loadu_si512(sums.x(r, b) + 64));
        sums.acc[k][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_permutexvar_ps(spread, sc),
                                         sums.acc[k][r]);
      }
    }
  if (b < nb)  // the last blocks (fewer than four) by the reference loop
    for (int k = 0; k < W; ++k)
      for (int r = 0; r < R; ++r)
        sums.tail[k][r] =
            q5_0_dot(w[k] + b * kQ5_0Bytes, sums.bytes(xq.q.data(), r, b),
                     xq.d.data() + sums.at(r, b), xq.s.data() + sums.at(r, b), nb - b);
  sums.finish(16.0f, out);
}
#endif

// The AVX-512 kernel of w's type (has_paired_kernel).
bool has_paired_kernel(ggml_type t) noexcept {
  return t == ggml_type::kQ4_1 || t == ggml_type::kQ8_0 ||
         (RELOKV_ENGINE_Q5_0 != 0 && t == ggml_type::kQ5_0);
}
template <int W, int R>
void paired_rows(ggml_type t, const std::uint8_t* const* w, int nb, const q8_activations& xq,
                 int i0, float* out) {
  switch (t) {
    case ggml_type::kQ4_1:
      return rows_q4_1<W, R>(w, nb, xq, i0, out);
    case ggml_type::kQ8_0:
      return rows_q8_0<W, R>(w, nb, xq, i0, out);
#if RELOKV_ENGINE_Q5_0
    case ggml_type::kQ5_0:
      return rows_q5_0<W, R>(w, nb, xq, i0, out);
#endif
    default:
      throw std::logic_error(std::string("qgemm: no paired kernel for ") + traits_of(t).name);
  }
}

#endif  // RELOKV_ENGINE_PAIRED

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

#if RELOKV_ENGINE_PAIRED
template void paired_rows<4, 1>(ggml_type, const std::uint8_t* const*, int, const q8_activations&,
                                int, float*);
template void paired_rows<1, 4>(ggml_type, const std::uint8_t* const*, int, const q8_activations&,
                                int, float*);
template void paired_rows<1, 1>(ggml_type, const std::uint8_t* const*, int, const q8_activations&,
                                int, float*);
#endif

}  // namespace relokv_engine::detail
