// Products from GGUF weights in their own types (see qgemm.hpp).
#include "qgemm.hpp"
#include "qgemm_blocks.hpp"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include <relokv/dtype.hpp>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define RELOKV_ENGINE_VNNI 1
#else
#define RELOKV_ENGINE_VNNI 0
#endif
// Q5_0's AVX-512 kernel also spreads bits with VPSHUFBITQMB and gathers bytes with VPERMT2B.
// The paired kernels gather bytes with VPERMT2B (AVX512_VBMI: Ice Lake and later, Zen 4; not
// Cascade Lake, whose VNNI serves the 256-bit block kernels).
#if RELOKV_ENGINE_VNNI && defined(__AVX512VBMI__)
#define RELOKV_ENGINE_PAIRED 1
#else
#define RELOKV_ENGINE_PAIRED 0
#endif
#if RELOKV_ENGINE_PAIRED && defined(__AVX512BITALG__)
#define RELOKV_ENGINE_Q5_0 1
#else
#define RELOKV_ENGINE_Q5_0 0
#endif
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace relokv_engine {
namespace {

constexpr int kQ4_1Bytes = 20, kQ8_0Bytes = 34;  // per block of 32: scale(s), then the values

#if RELOKV_ENGINE_VNNI
// GCC 12 reports a false -Wmaybe-uninitialized (and -Wuninitialized) inside the AVX-512 insert,
// convert and reduce intrinsics (their _mm512_undefined_* operands, GCC bug 105593); the kernels
// below use them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

#if RELOKV_ENGINE_PAIRED
constexpr int kQ5_0Bytes = 22;
// Rows of at most this many bytes are multiplied four at a time in decode.
constexpr std::size_t kInterleavedRowBytes = 640;

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
constexpr bool has_paired_kernel(ggml_type t) noexcept {
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

// fp32 activations: one weight row against one fp32 row, each block dequantized in registers
// (d * q, plus m * sum(x) for Q4_1 with the block sums xs given).
template <bool Q41>
float direct_avx512(const std::uint8_t* w, int nb, const float* x, const float* xs) {
  constexpr int bytes = Q41 ? kQ4_1Bytes : kQ8_0Bytes;
  __m512 acc = _mm512_setzero_ps();
  float extra = 0.0f;
  for (int b = 0; b < nb; ++b, w += bytes, x += 32) {
    __m512 lo, hi;
    if constexpr (Q41) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 4));
      const __m128i m4 = _mm_set1_epi8(0x0F);
      lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, m4)));
      hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), m4)));
      extra += fp16_at(w + 2) * xs[b];
    } else {
      const __m128i qa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
      const __m128i qb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 18));
      lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(qa));
      hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(qb));
    }
    const __m512 s =
        _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(x)));
    acc = _mm512_fmadd_ps(s, _mm512_set1_ps(fp16_at(w)), acc);
  }
  return hsum(acc) + extra;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// The sum of each block of 32 of x (nblocks of them): Q4_1's minimum term.
void block_sums(const float* x, std::size_t nblocks, float* out) {
  for (std::size_t k = 0; k < nblocks; ++k) {
    float s = 0.0f;
    for (int j = 0; j < 32; ++j) s += x[k * 32 + static_cast<std::size_t>(j)];
    out[k] = s;
  }
}

// The reference for fp32 activations: the same sums in element order.
float direct_portable(const qmatrix& w, std::int32_t r, const float* x, const float* xs) {
  const bool q41 = w.type == ggml_type::kQ4_1;
  const std::uint8_t* p = w.row(r);
  float acc = 0.0f;
  for (int b = 0; b < w.cols / 32; ++b, x += 32) {
    float s = 0.0f;
    if (q41) {
      const std::uint8_t* q = p + 4;
      for (int j = 0; j < 16; ++j)
        s += static_cast<float>(q[j] & 0xF) * x[j] + static_cast<float>(q[j] >> 4) * x[j + 16];
      acc += fp16_at(p) * s + fp16_at(p + 2) * xs[b];
      p += kQ4_1Bytes;
    } else {
      const auto* q = reinterpret_cast<const std::int8_t*>(p + 2);
      for (int j = 0; j < 32; ++j) s += static_cast<float>(q[j]) * x[j];
      acc += fp16_at(p) * s;
      p += kQ8_0Bytes;
    }
  }
  return acc;
}

}  // namespace

namespace {
std::atomic<bool> g_integer{true};
// The integer kernels' instruction set: 0 the build's best, 1 AVX2's block kernels, 2 scalar.
std::atomic<int> g_isa{0};

block_isa block_isa_now() noexcept {
  switch (g_isa.load(std::memory_order_relaxed)) {
    case 1:
      return block_isa::kAvx2;
    case 2:
      return block_isa::kPortable;
    default:
      return RELOKV_ENGINE_VNNI                      ? block_isa::kVnni256
             : block_isa_available(block_isa::kAvx2) ? block_isa::kAvx2
                                                     : block_isa::kPortable;
  }
}
}  // namespace

void use_integer_kernels(bool on) noexcept { g_integer.store(on, std::memory_order_relaxed); }

bool integer_kernels_on() noexcept { return g_integer.load(std::memory_order_relaxed); }

bool has_integer_kernel(ggml_type t) noexcept {
  return has_block_decode(t) && integer_kernels_on();
}

const char* integer_kernel_isa() noexcept {
  switch (block_isa_now()) {
    case block_isa::kVnni256:
      return "avx512-vnni";
    case block_isa::kAvx2:
      return "avx2";
    case block_isa::kPortable:
      break;
  }
  return "portable";
}

std::vector<std::string> integer_kernel_isas() {
  std::vector<std::string> out;
  if (RELOKV_ENGINE_VNNI) out.emplace_back("avx512-vnni");
  if (block_isa_available(block_isa::kAvx2)) out.emplace_back("avx2");
  out.emplace_back("portable");
  return out;
}

bool select_integer_kernel_isa(const std::string& isa) noexcept {
  const auto have = integer_kernel_isas();
  if (std::find(have.begin(), have.end(), isa) == have.end()) return false;
  g_isa.store(isa == "portable" ? 2 : isa == "avx2" ? 1 : 0, std::memory_order_relaxed);
  return true;
}

qmatrix qmatrix::over(ggml_type t, std::int32_t rows, std::int32_t cols, const std::uint8_t* data,
                      std::shared_ptr<const void> hold) {
  const type_traits tr = traits_of(t);
  qmatrix m;
  m.type = t;
  m.rows = rows;
  m.cols = cols;
  m.data = data;
  m.row_bytes = static_cast<std::size_t>(cols) / tr.block_elems * tr.block_bytes;
  m.hold = std::move(hold);
  return m;
}

qmatrix qmatrix::view(const gguf_file& f, const gguf_tensor& t, std::shared_ptr<const void> hold) {
  if (t.dims.size() != 2 || t.dims[0] == 0 || t.dims[1] == 0 || t.dims[0] > (1u << 24) ||
      t.dims[1] > (1u << 24))
    throw gguf_error(f.name(), t.offset, "tensor '" + t.name + "' is not a matrix");
  const type_traits tr = traits_of(t.type);
  if (t.dims[0] % tr.block_elems != 0)
    throw gguf_error(f.name(), t.offset,
                     "tensor '" + t.name + "': rows of " + std::to_string(t.dims[0]) +
                         " elements are not whole " + tr.name + " blocks");
  return over(t.type, static_cast<std::int32_t>(t.dims[1]), static_cast<std::int32_t>(t.dims[0]),
              t.data, std::move(hold));
}

qmatrix qmatrix::owned(std::vector<float> w, std::int32_t rows, std::int32_t cols) {
  auto v = std::make_shared<std::vector<float>>(std::move(w));
  const auto* data = reinterpret_cast<const std::uint8_t*>(v->data());
  return over(ggml_type::kF32, rows, cols, data, std::move(v));
}

void qmatrix::dequantize_row(std::int32_t r, float* out) const {
  dequantize_blocks(type, row(r), static_cast<std::uint64_t>(cols), out);
}

// GCC 12's false -Wmaybe-uninitialized inside the AVX-512 intrinsics again (see the kernels).
#if RELOKV_ENGINE_VNNI && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
void q8_activations::quantize(const float* x, std::int32_t rows, std::int32_t width) {
  n = rows;
  cols = width;
  const auto nbk = static_cast<std::size_t>(width / 32);
  q.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(width));
  d.resize(static_cast<std::size_t>(rows) * nbk);
  s.resize(d.size());
  ds.resize(2 * d.size());
  s16.resize(2 * d.size());
  for (std::size_t blk = 0; blk < d.size(); ++blk) {
    const float* xb = x + blk * 32;
    std::int8_t* qb = q.data() + blk * 32;
    int sum = 0, first = 0;
    float scale = 0.0f;
#if RELOKV_ENGINE_VNNI
    // The same values as the loop below: VCVTPS2DQ rounds to nearest even, as lrintf does.
    const __m512 lo = _mm512_loadu_ps(xb), hi = _mm512_loadu_ps(xb + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    scale = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtsepi32_epi8(qhi));
    first = _mm512_reduce_add_epi32(qlo);
    sum = first + _mm512_reduce_add_epi32(qhi);
#else
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(xb[j]));
    scale = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < 32; ++j) {
      qb[j] = static_cast<std::int8_t>(std::lrintf(xb[j] * inv));
      sum += qb[j];
      if (j == 15) first = sum;
    }
#endif
    s16[2 * blk] = scale * static_cast<float>(first);
    s16[2 * blk + 1] = scale * static_cast<float>(sum - first);
    d[blk] = scale;
    s[blk] = scale * static_cast<float>(sum);
    ds[2 * blk] = scale;
    ds[2 * blk + 1] = s[blk];
  }
#if RELOKV_ENGINE_PAIRED  // the layouts only the AVX-512 kernels read
  q4_1_order(q, rows, width, qp, qp_stride);
#if RELOKV_ENGINE_Q5_0
  q5_0_order(q, rows, width, qq);
#endif
#endif
}
#if RELOKV_ENGINE_VNNI && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

float qdot_portable(const qmatrix& w, std::int32_t r, const q8_activations& xq, std::int32_t i) {
  return block_dot_portable(w, r, xq, i);
}

float qdot_fp32_portable(const qmatrix& w, std::int32_t r, const float* x) {
  std::vector<float> sums(static_cast<std::size_t>(w.cols / 32));
  block_sums(x, sums.size(), sums.data());
  return direct_portable(w, r, x, sums.data());
}

void qmatmul_rows(const qmatrix& w, const float* x, const q8_activations* xq, std::int32_t n,
                  float* y, std::int32_t ldy, std::int32_t r0, std::int32_t r1) {
  if (r1 <= r0 || n <= 0) return;
  if (xq != nullptr && integer_product(w, n)) {
    const block_isa isa = block_isa_now();
#if RELOKV_ENGINE_PAIRED
    if (isa == block_isa::kVnni256 && has_paired_kernel(w.type)) {
      const int nb = w.cols / 32;
      std::int32_t r = r0;
      // Decode: four short rows at a time (SmolLM2's 576 columns: their sums' chains and the
      // row loop's overheads had left the kernel at half its speed on long rows). Long rows
      // stream faster one at a time (bench/bench_gemv.cpp).
      if (n == 1 && w.row_bytes <= kInterleavedRowBytes)
        for (; r + 4 <= r1; r += 4) {
          const std::uint8_t* rows[4] = {w.row(r), w.row(r + 1), w.row(r + 2), w.row(r + 3)};
          paired_rows<4, 1>(w.type, rows, nb, *xq, 0, y + r);
        }
      for (; r < r1; ++r) {
        const std::uint8_t* row = w.row(r);
        std::int32_t i = 0;
        float out[4];
        for (; i + 4 <= n; i += 4) {
          paired_rows<1, 4>(w.type, &row, nb, *xq, i, out);
          for (int k = 0; k < 4; ++k) y[static_cast<std::size_t>(i + k) * ldy + r] = out[k];
        }
        for (; i < n; ++i) {
          paired_rows<1, 1>(w.type, &row, nb, *xq, i, out);
          y[static_cast<std::size_t>(i) * ldy + r] = out[0];
        }
      }
      return;
    }
#endif
    block_rows(isa, w, *xq, n, y, ldy, r0, r1);
    return;
  }
  if (n <= kIntegerMaxRows && (w.type == ggml_type::kQ4_1 || w.type == ggml_type::kQ8_0)) {
    // A few fp32 rows (prefill's logits, short prompts): blocks dequantized in registers.
    const int nb = w.cols / 32;
    thread_local std::vector<float> sums;  // per row of x and block: the sum of its elements
    sums.resize(static_cast<std::size_t>(n) * static_cast<std::size_t>(nb));
    block_sums(x, sums.size(), sums.data());
    [[maybe_unused]] const bool q41 = w.type == ggml_type::kQ4_1;
    for (std::int32_t r = r0; r < r1; ++r)
      for (std::int32_t i = 0; i < n; ++i) {
        const float* xi = x + static_cast<std::size_t>(i) * static_cast<std::size_t>(w.cols);
        const float* si = sums.data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(nb);
#if RELOKV_ENGINE_VNNI
        const float v = q41 ? direct_avx512<true>(w.row(r), nb, xi, si)
                            : direct_avx512<false>(w.row(r), nb, xi, si);
#else
        const float v = direct_portable(w, r, xi, si);
#endif
        y[static_cast<std::size_t>(i) * static_cast<std::size_t>(ldy) +
          static_cast<std::size_t>(r)] = v;
      }
    return;
  }
  if (w.type == ggml_type::kF32) {  // the weights as they are
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, r1 - r0, w.cols, 1.0f, x, w.cols,
                reinterpret_cast<const float*>(w.row(r0)), w.cols, 0.0f, y + r0, ldy);
    return;
  }
  // Panels of rows dequantized into a per-thread buffer of at most 4 MiB (a lane's share of
  // a layer's matrix, for SmolLM2 and Qwen2.5-0.5B), each multiplied with one BLAS call:
  // small panels would make BLAS pack the activations again for every panel.
  const std::int32_t kPanel =
      std::max<std::int32_t>(16, static_cast<std::int32_t>((std::size_t{4} << 20) / sizeof(float) /
                                                           static_cast<std::size_t>(w.cols)));
  thread_local std::vector<float> panel;
  panel.resize(static_cast<std::size_t>(std::min(kPanel, r1 - r0)) *
               static_cast<std::size_t>(w.cols));
  for (std::int32_t p0 = r0; p0 < r1; p0 += kPanel) {
    const std::int32_t rows = std::min(kPanel, r1 - p0);
    for (std::int32_t r = 0; r < rows; ++r)
      w.dequantize_row(p0 + r, panel.data() + static_cast<std::size_t>(r) * w.cols);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, w.cols, 1.0f, x, w.cols,
                panel.data(), w.cols, 0.0f, y + p0, ldy);
  }
}

}  // namespace relokv_engine
