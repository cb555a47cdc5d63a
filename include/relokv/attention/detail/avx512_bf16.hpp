#pragma once
/// @file
/// The AVX512_BF16 path: decode in spans of up to 64 slots and the dispatch tag; the block
/// kernel (VDPBF16PS products with fp32 sums) is in detail/avx512_bf16_block.hpp.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include "relokv/attention/detail/avx512_bf16_block.hpp"

#include "relokv/attention/detail/kernel_common.hpp"
#include "relokv/attention/detail/prefetch.hpp"
#include "relokv/attention/detail/simd.hpp"
#include "relokv/attention/detail/simd_f32.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/dtype.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN
namespace detail {

#if RELOKV_HOST_SIMD
#if RELOKV_HOST_BF16_DOT

/// Decode on the bf16 path works on spans of up to kSpanChunks chunks of at most 16 slots (from
/// one or more blocks): the online-softmax step, a chain of dependent reductions and an exp
/// per query head, runs once per span instead of once per chunk, and the P.V accumulators stay
/// in registers over the span and are folded into the running state once. Keys are read chunk
/// by chunk for all the call's KV heads (memory order), values head by head from L2, where
/// they were prefetched while the keys were scored.
inline constexpr int kSpanChunks = 4;

static_assert(kSpanChunks <= prefetch_cursor::kMaxRanges,
              "a span's values, or the next span's keys, are one prefetch range per chunk");

/// `rows` query rows (scaled, [rows][D] from q) as bf16 into dst, rotated by qc/qs when set
/// (see load_query_rows; the rotation rows are loaded once for all rows).
template <int DC>
void bf16_query_rows(int rows, const float* q, const float* qc, const float* qs, rope_layout layout,
                     std::uint16_t* dst, prefetch_cursor& pf) {
  using simd::vf16;
  constexpr int D = 16 * DC;
  const auto store = [&](int r, const vf16(&v)[DC]) {
    for (int cb = 0; cb < DC / 2; ++cb)
      _mm512_storeu_si512(
          dst + r * D + 32 * cb,
          __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(v[2 * cb + 1], v[2 * cb])));
  };
  if (qc != nullptr && layout == rope_layout::kNeoX) {
    vf16 C[DC / 2], S[DC / 2];
    for (int c = 0; c < DC / 2; ++c) {
      C[c] = RELOKV_VLOAD(qc + 16 * c);
      S[c] = RELOKV_VLOAD(qs + 16 * c);
    }
    for (int r = 0; r < rows; ++r) {
      pf.advance();
      const float* qg = q + r * D;
      vf16 v[DC];
      for (int c = 0; c < DC / 2; ++c) {
        const vf16 x1 = RELOKV_VLOAD(qg + 16 * c), x2 = RELOKV_VLOAD(qg + 16 * (c + DC / 2));
        v[c] = x1 * C[c] - x2 * S[c];
        v[c + DC / 2] = x1 * S[c] + x2 * C[c];
      }
      store(r, v);
    }
  } else {
    for (int r = 0; r < rows; ++r) {
      pf.advance();
      vf16 v[DC];
      load_query_rows<DC>(q + r * D, qc, qs, layout, v);
      store(r, v);
    }
  }
}

/// The keys of one chunk (vc visible rows of each of nr <= kRotHeads heads, the first at kb,
/// the next tile_elems further) rotated by their slots' R(j) into dst ([nr][16][D]); four
/// slots at a time, one prefetch step per head and four slots (rot_steps of bf16_decode_spans).
template <int DC>
void rotate_span_keys(const std::uint16_t* kb, std::ptrdiff_t tile_elems, int nr, int vc,
                      const std::uint32_t* krot, std::uint16_t* dst, prefetch_cursor& pf) {
  constexpr int D = 16 * DC, DB = DC / 2;
  static_assert(kRotHeads == 2, "rotate_span_keys handles one or two heads");
  for (int j = 0; j < 16; j += 4) {
    for (int h = 0; h < nr; ++h) pf.advance();
    if (j >= vc) continue;
    const int n = vc - j < 4 ? vc - j : 4;
    const std::uint32_t* tab = krot + static_cast<std::size_t>(j) * DB * 32;
    if (nr == 2) {
      rotate_keys_bf16<DC, 2>(kb + j * D, n, tab, dst + j * D, tile_elems, 16 * D);
    } else {
      rotate_keys_bf16<DC, 1>(kb + j * D, n, tab, dst + j * D);
    }
  }
}

/// Scores of one chunk of keys (kb: 16 rows, at_attention's already rotated by their slots'
/// R(j), see rotate_span_keys) for the G query heads of one KV head: qb holds their bf16 rows
/// ([G][D]), score row g goes to sc + g * SL (16 lanes; lanes past the chunk's visible slots
/// hold anything).
template <int DC>
void bf16_span_scores(const std::uint16_t* kb, const std::uint16_t* qb16, float* sc, int G,
                      prefetch_cursor& pf) {
  using namespace simd;
  constexpr int D = 16 * DC, DB = DC / 2, SL = 16 * kSpanChunks;
  for (int g = 0; g < G; ++g) {
    pf.advance();
    __m512bh qb[DB];
    for (int cb = 0; cb < DB; ++cb)
      qb[cb] = __builtin_bit_cast(__m512bh, _mm512_loadu_si512(qb16 + g * D + 32 * cb));
    const auto kload = [&](int j, int cb) {
      return __builtin_bit_cast(__m512bh, _mm512_loadu_si512(kb + j * D + 32 * cb));
    };
    // Key rows in address order (each row's DB loads in turn); sixteen independent chains
    // keep the dot-product units busy.
    vf16 part[16];
    for (int j = 0; j < 16; ++j) {
      part[j] = _mm512_dpbf16_ps(vf16{}, kload(j, 0), qb[0]);
      for (int cb = 1; cb < DB; ++cb) part[j] = _mm512_dpbf16_ps(part[j], kload(j, cb), qb[cb]);
    }
    vf16 x;
    transpose_sum(part, x);
    RELOKV_VSTORE(sc + g * SL, x);
  }
}

/// One softmax step over a span for `rows` query heads: scores sc ([rows][SL], lanes past
/// vcs[c] of chunk c dead, possibly garbage: left out of the max, weight 0), state st
/// ([rows]); the weights go to pbs ([rows][SL], bf16), the corrections to corr ([rows]).
/// Sixteen rows at a time: their maxima and sums are reduced together by a transpose and
/// their corrections are one vector exp, so no row waits on its own chain of reductions.
inline void bf16_span_softmax(int rows, int n, const int* vcs, const float* sc,
                              const softmax_rows& st, std::uint16_t* pbs, float* corr,
                              prefetch_cursor& pf) {
  using namespace simd;
  constexpr int SL = 16 * kSpanChunks;
  const vf16 ninf = vf16{} - __builtin_inff();
  const auto vmax = [](const vf16& a, const vf16& b) { return a > b ? a : b; };
  for (int r0 = 0; r0 < rows; r0 += 16) {
    const int nr = rows - r0 < 16 ? rows - r0 : 16;
    const auto live_rows = static_cast<__mmask16>((1u << nr) - 1u);
    vf16 part[16];
    for (int i = 0; i < 16; ++i) {
      part[i] = ninf;
      if (i >= nr) continue;
      const float* xs = sc + (r0 + i) * SL;
      for (int c = 0; c < n; ++c) {
        const auto live = static_cast<__mmask16>((1u << vcs[c]) - 1u);
        part[i] = vmax(part[i], _mm512_mask_blend_ps(live, ninf, RELOKV_VLOAD(xs + 16 * c)));
      }
    }
    vf16 bmax;
    transpose_reduce(part, bmax, simd::max_op{});
    const vf16 m_old = _mm512_mask_loadu_ps(ninf, live_rows, st.mx + r0);
    const vf16 m_new = vmax(m_old, bmax);
    vf16 cr = m_old - m_new;
    exp_nonpositive(cr);  // 0 on the first span
    alignas(64) float mrow[16];
    RELOKV_VSTORE(mrow, m_new);
    for (int i = 0; i < 16; ++i) {
      part[i] = vf16{};
      if (i >= nr) continue;
      pf.advance();
      const float* xs = sc + (r0 + i) * SL;
      for (int c = 0; c < n; ++c) {
        vf16 x = RELOKV_VLOAD(xs + 16 * c) - mrow[i];
        exp_nonpositive(x);
        live_only(x, vcs[c]);
        std::uint16_t* pb = pbs + (r0 + i) * SL + 16 * c;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb),
                            __builtin_bit_cast(__m256i, _mm512_cvtneps_pbh(x)));
        load_bf16(x, pb);  // the weights as rounded, so that the normalized weights sum to one
        part[i] += x;
      }
    }
    vf16 bsum;
    transpose_sum(part, bsum);
    // fold() of sixteen rows: sum * corr + the new weights' sum
    const vf16 s_old = _mm512_maskz_loadu_ps(live_rows, st.sum + r0);
    _mm512_mask_storeu_ps(st.sum + r0, live_rows, s_old * cr + bsum);
    _mm512_mask_storeu_ps(st.mx + r0, live_rows, m_new);
    _mm512_mask_storeu_ps(corr + r0, live_rows, cr);
  }
}

/// P.V of a span for the G query heads of one KV head, HP heads at a time, as in
/// bf16_block_head: slots t and t + 1 interleaved per dimension in registers (a missing
/// partner is zero); the products start from zero, stay in registers over the span's n chunks
/// (v[c]: chunk c's first value row, vcs[c] visible slots) and are folded into acc ([G][D],
/// bf16_acc_index order) as acc * corr[g] + P.V. pw: the weights ([G][SL]).
template <int DC>
void bf16_span_pv(int n, const std::uint16_t* const* v, const int* vcs, const std::uint16_t* pw,
                  const float* corr, float* acc_g, int G, prefetch_cursor& pf) {
  using namespace simd;
  constexpr int D = 16 * DC, SL = 16 * kSpanChunks;
  constexpr int HP = bf16_pv_heads(DC);
  const auto pv = [&](int g0, auto heads) {
    constexpr int N = decltype(heads)::value;
    vf16 a[N][DC];
    for (int gi = 0; gi < N; ++gi)
      for (int c = 0; c < DC; ++c) a[gi][c] = vf16{};
    const auto step = [&](const std::uint16_t* vb, const std::uint16_t* pc, int t, bool pair) {
      pf.advance();
      bf16_pv_step<DC, N>(vb + t * D, pair, pc + g0 * SL + t, SL, a);
    };
    for (int c = 0; c < n; ++c) {
      const int vc = vcs[c];
      int t = 0;
      for (; t + 1 < vc; t += 2) step(v[c], pw + 16 * c, t, true);
      if (t < vc) step(v[c], pw + 16 * c, t, false);
    }
    for (int gi = 0; gi < N; ++gi) {
      float* acc = acc_g + static_cast<std::size_t>(g0 + gi) * D;
      const float f = corr[g0 + gi];
      for (int c = 0; c < DC; ++c)
        RELOKV_VSTORE(acc + 16 * c, RELOKV_VLOAD(acc + 16 * c) * f + a[gi][c]);
    }
  };
  int g0 = 0;
  for (; g0 + HP <= G; g0 += HP) pv(g0, std::integral_constant<int, HP>{});
  for (; g0 < G; ++g0) pv(g0, std::integral_constant<int, 1>{});
}

/// Decode of one query over a sequence's blocks on the bf16 path, in spans (kSpanChunks) for
/// the KV heads [h_begin, h_end). query_angles(bi, pos0, m) leaves R(m - pos0) in w.cs/w.sn
/// (attend_group's decode chain); the query's scaled rows are w.qrot (rotated at m for
/// pre_rotated, in bf16_acc_index order for rot_bf16), its state w.acc and sm (from its first
/// head's row on).
template <class P, class Angles>
void bf16_decode_spans(const paged_kv_view<const bf16>& kv, const block_entry* blocks,
                       std::int32_t num_blocks, pos_t mq, int G, int h_begin, int h_end,
                       rope_layout layout, int pairs, bool rot_bf16, Angles&& query_angles,
                       const softmax_rows& sm, attention_scratch& w) {
  const int D = kv.head_dim, nh = h_end - h_begin;
  if (nh <= 0) return;
  constexpr int SL = 16 * kSpanChunks;
  const auto hd = static_cast<std::size_t>(D);
  constexpr bool rotates_q = P::kind != placement_kind::kPreRotated;
  const rope_layout qlayout = rot_bf16 ? rope_layout::kNeoX : layout;
  w.span_qc.resize(kSpanChunks * hd);
  w.span_qs.resize(kSpanChunks * hd);
  w.span_sc.resize(static_cast<std::size_t>(nh * G) * SL);
  w.wb16.resize(w.span_sc.size());
  w.qb16.resize(static_cast<std::size_t>(nh * G) * hd);
  w.corr.resize(static_cast<std::size_t>(nh * G));
  const auto kp = [&](block_id b, int h, int j0) {
    return reinterpret_cast<const std::uint16_t*>(kv.k(b, h)) + static_cast<std::ptrdiff_t>(j0) * D;
  };
  const auto vp = [&](block_id b, int h, int j0) {
    return reinterpret_cast<const std::uint16_t*>(kv.v(b, h)) + static_cast<std::ptrdiff_t>(j0) * D;
  };
  // The keys (or values) of a chunk for all heads of the call: one range in memory.
  const std::ptrdiff_t tile = kv.tile_elems() * static_cast<std::ptrdiff_t>(sizeof(bf16));
  const auto heads_bytes = [&](int vc) {
    return (nh - 1) * tile + static_cast<std::ptrdiff_t>(vc) * D * std::ptrdiff_t{2};
  };
  int n = 0;
  block_id cblock[kSpanChunks] = {};
  int cj0[kSpanChunks] = {}, cvc[kSpanChunks] = {};
  bool new_q[kSpanChunks] = {};
  // Computes the span for every head: the scores of each chunk for all heads (keys in memory
  // order), one softmax step for all query rows (independent chains, so they overlap), then
  // P.V head by head. (next_bi, next_j0): where the next span starts; its keys and values
  // stream in meanwhile.
  const auto run = [&](std::int32_t next_bi, int next_j0) {
    // While the keys are scored, this span's values stream in; while the values are summed,
    // the next span's keys.
    prefetch_cursor pf, pf2;
    for (int c = 0; c < n; ++c) pf.add(vp(cblock[c], h_begin, cj0[c]), heads_bytes(cvc[c]));
    for (std::int32_t b = next_bi, j = next_j0, k = 0; b < num_blocks && k < kSpanChunks;
         ++b, j = 0)
      for (const int valid = visible_slots(blocks[b], mq); j < valid && k < kSpanChunks;
           j += 16, ++k)
        pf2.add(kp(blocks[b].block, h_begin, j), heads_bytes(std::min(16, valid - j)));
    const int HP = bf16_pv_heads(D / 16);
    int npairs = 0;
    for (int c = 0; c < n; ++c) npairs += (cvc[c] + 1) / 2;
    int nq = 0;
    for (int c = 0; c < n; ++c) nq += new_q[c] ? 1 : 0;
    // Steps that advance each: query rows, key rotations and scores; softmax rows and P.V
    // pairs.
    constexpr int rot_steps = P::kind == placement_kind::kAtAttention ? 4 : 0;
    pf.spread(std::int64_t{nh} * (G * (n + nq) + rot_steps * n));
    pf2.spread(std::int64_t{nh} * (G + (G / HP + G % HP) * npairs));
    for (int c = 0; c < n; ++c) {
      if (new_q[c]) {  // the query rows of every head, rotated for this block, as bf16
        const float* qc = rotates_q ? w.span_qc.data() + static_cast<std::size_t>(c) * hd : nullptr;
        const float* qs = w.span_qs.data() + static_cast<std::size_t>(c) * hd;
        with_chunks(D, [&](auto dc) {
          bf16_query_rows<decltype(dc)::value>(
              nh * G, w.qrot.data() + static_cast<std::size_t>(h_begin * G) * hd, qc, qs, qlayout,
              w.qb16.data(), pf);
        });
      }
      for (int h0 = h_begin; h0 < h_end; h0 += kRotHeads) {
        const int nr = std::min(kRotHeads, h_end - h0);
        with_chunks(D, [&](auto dc) {
          constexpr int DC = decltype(dc)::value;
          const std::uint16_t* keys = kp(cblock[c], h0, cj0[c]);
          std::ptrdiff_t stride = kv.tile_elems();
          if constexpr (P::kind == placement_kind::kAtAttention) {
            // rows past the visible ones hold stale data; their scores are masked later
            rotate_span_keys<DC>(keys, stride, nr, cvc[c],
                                 w.krot.data() + static_cast<std::size_t>(cj0[c]) * (DC / 2) * 32,
                                 w.kb16.data(), pf);
            keys = w.kb16.data();
            stride = 16 * D;
          }
          for (int i = 0; i < nr; ++i) {
            const int r = (h0 + i - h_begin) * G;
            bf16_span_scores<DC>(
                keys + i * stride, w.qb16.data() + static_cast<std::size_t>(r) * hd,
                w.span_sc.data() + static_cast<std::size_t>(r) * SL + 16 * c, G, pf);
          }
        });
      }
    }
    pf.finish();
    bf16_span_softmax(nh * G, n, cvc, w.span_sc.data(),
                      sm.from(static_cast<std::size_t>(h_begin * G)), w.wb16.data(), w.corr.data(),
                      pf2);
    const std::uint16_t* vrow[kSpanChunks] = {};
    for (int h = h_begin; h < h_end; ++h) {
      const int r = (h - h_begin) * G;
      for (int c = 0; c < n; ++c) vrow[c] = vp(cblock[c], h, cj0[c]);
      with_chunks(D, [&](auto dc) {
        bf16_span_pv<decltype(dc)::value>(
            n, vrow, cvc, w.wb16.data() + static_cast<std::size_t>(r) * SL, w.corr.data() + r,
            w.acc.data() + static_cast<std::size_t>(h * G) * hd, G, pf2);
      });
    }
    pf2.finish();
    n = 0;
  };
  for (std::int32_t bi = 0; bi < num_blocks; ++bi) {
    const block_entry e = blocks[bi];
    const int valid = visible_slots(e, mq);
    for (int j0 = 0; j0 < valid; j0 += 16) {
      if (n == kSpanChunks) run(bi, j0);
      const int c = n++;
      cblock[c] = e.block;
      cj0[c] = j0;
      cvc[c] = std::min(16, valid - j0);
      new_q[c] = c == 0 || (rotates_q && j0 == 0);
      if constexpr (rotates_q) {
        // w.cs/w.sn keep R(m - pos0) of the current block from its first chunk on; only a
        // chunk that rotates the query rows (new_q) needs them in its own row.
        if (j0 == 0) query_angles(bi, e.pos0, mq);
        if (new_q[c]) {
          float* rc = w.span_qc.data() + static_cast<std::size_t>(c) * hd;
          float* rs = w.span_qs.data() + static_cast<std::size_t>(c) * hd;
          if (rot_bf16) {
            to_acc_order(pairs, w.cs.data(), rc);
            to_acc_order(pairs, w.sn.data(), rs);
          } else if (layout == rope_layout::kNeoX) {
            std::copy(w.cs.begin(), w.cs.begin() + pairs, rc);
            std::copy(w.sn.begin(), w.sn.begin() + pairs, rs);
          } else {
            expand_rotation(layout, pairs, D, w.cs.data(), w.sn.data(), rc, rs);
          }
        }
      }
    }
  }
  if (n > 0) run(num_blocks, 0);
}

/// The rotations R(j) of a block's slots j < bs (times the magnitude factor) as
/// rotate_keys_bf16 reads them: for slot j and each group of 16 pairs in bf16_acc_index order
/// of the head's first half (the order the key's 16-bit unpacks leave its pairs in), 16
/// (cos, -sin) then 16 (sin, cos) bf16 pairs, the first of each in the low half. jcos/jsin:
/// [bs][pairs] unit rotations; out: [bs][2 * pairs]. Built once per call: at_attention's keys
/// are rotated by their offset in the block, the query by the block's position
/// (R(m) q . R(pos0 + j) k = R(m - pos0) q . R(j) k).
inline void build_slot_rotations_bf16(int bs, int pairs, float mag, const float* jcos,
                                      const float* jsin, std::uint32_t* out) {
  using simd::vf16;
  // Word l of the low vector next to word l of the high one: (lo_l, hi_l) in dword l.
  alignas(64) std::uint16_t idx[32];
  for (int l = 0; l < 16; ++l) {
    idx[2 * l] = static_cast<std::uint16_t>(l);
    idx[2 * l + 1] = static_cast<std::uint16_t>(16 + l);
  }
  const __m512i interleave = _mm512_load_si512(idx);
  const auto pairs_of = [&](const vf16& lo, const vf16& hi) {
    return _mm512_permutexvar_epi16(interleave,
                                    __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(hi, lo)));
  };
  for (int j = 0; j < bs; ++j)
    for (int u = 0; u < pairs / 16; ++u) {
      alignas(64) float c[16], sn[16];
      for (int l = 0; l < 16; ++l) {
        const std::size_t i = static_cast<std::size_t>(j * pairs + bf16_acc_dim(16 * u + l));
        c[l] = mag * jcos[i];
        sn[l] = mag * jsin[i];
      }
      const vf16 C = RELOKV_VLOAD(c), S = RELOKV_VLOAD(sn);
      std::uint32_t* dst = out + static_cast<std::size_t>(2 * j * pairs + 32 * u);
      _mm512_storeu_si512(dst, pairs_of(C, -S));
      _mm512_storeu_si512(dst + 16, pairs_of(S, C));
    }
}

/// The AVX512_BF16 path as attend_group's dispatch tag (bf16 storage, the fast path's shapes):
/// VDPBF16PS products with fp32 sums, accumulators in bf16_acc_index order, decode in spans.
struct avx512_bf16_path {
  static constexpr bool kSimd = true;
  static constexpr bool kBf16Dot = true;
  template <class P>
  static void block_head(const block_head_t<bf16>& bh, attention_scratch& w) {
    with_chunks(bh.D, [&](auto dc) { bf16_block_head<decltype(dc)::value, P>(bh, w); });
  }
  /// Prefill's rows that see a block-head at once: the fp32 path's group kernel, the block's
  /// keys and values converted once per block and head and shared by every row.
  template <class P>
  static void group(const block_head_t<bf16>& bh, group_row* rows, int n, attention_scratch& w) {
    simd_f32_path::group<P>(bh, rows, n, w);
  }
  template <class P, class... Args>
  static void decode_spans(Args&&... args) {
    bf16_decode_spans<P>(std::forward<Args>(args)...);
  }
  static int acc_index(int d) { return bf16_acc_index(d); }
  static void acc_order(int n, const float* src, float* dst) { to_acc_order(n, src, dst); }
  static void slot_rotations(int bs, int pairs, float mag, const float* jcos, const float* jsin,
                             std::uint32_t* out) {
    build_slot_rotations_bf16(bs, pairs, mag, jcos, jsin, out);
  }
};
#endif
#endif  // RELOKV_HOST_SIMD

}  // namespace detail
RELOKV_NAMESPACE_END
