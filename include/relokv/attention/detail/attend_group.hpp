#pragma once
/// @file
/// One group of queries of one sequence over its blocks, for a path chosen once per call by a
/// tag type (portable_path, simd_f32_path, avx512_bf16_path; with_path picks it), and decode
/// or prefill as a template argument.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "relokv/attention/call.hpp"
#include "relokv/attention/detail/amx_bf16.hpp"
#include "relokv/attention/detail/avx512_bf16.hpp"
#include "relokv/attention/detail/kernel_common.hpp"
#include "relokv/attention/detail/portable.hpp"
#include "relokv/attention/detail/prefetch.hpp"
#include "relokv/attention/detail/simd.hpp"
#include "relokv/attention/detail/simd_f32.hpp"
#include "relokv/attention/kv_head_range.hpp"
#include "relokv/attention/softmax.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/dtype.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN
namespace detail {

/// Attention of a group of queries of one sequence (each with all its query heads) over the
/// sequence's blocks. Blocks are the outer loop, so a block's K/V are read once per group while
/// they sit in cache, and per-block work (key rotations for at_attention) is shared.
/// q: [nq][num_q_heads][head_dim], unrotated; m: [nq]; out: [nq][num_q_heads][head_dim].
/// The one place a path is chosen: AVX512_BF16 for bf16 storage where the host has it,
/// SIMD fp32 (AVX-512 or AVX2) for the shapes its kernels take (head_dim 64, 128 or 256, block size
/// a multiple of 16), the portable path otherwise. Calls f(path tag).
template <class T, class F>
void with_path(const paged_kv_view<const T>& kv, F&& f) {
  [[maybe_unused]] const bool fast =
      kv.block_size % 16 == 0 && (kv.head_dim == 64 || kv.head_dim == 128 || kv.head_dim == 256);
#if RELOKV_HOST_BF16_DOT
  if constexpr (std::is_same_v<T, bf16>)
    if (fast) return f(avx512_bf16_path{});
#endif
#if RELOKV_HOST_SIMD
  if (fast) return f(simd_f32_path{});
#endif
  f(portable_path{});
}

/// The queries [q_first, q_first + nq) of sequence `seq` of the call `p` (checked by
/// can_implement): decode when Decode (then nq == 1 and q_first == seq).
template <class P, class Path, bool Decode, class T>
void attend_group(const attention_params<T>& p, std::int32_t seq, std::int32_t q_first, int nq) {
  const rope_table& rope = *p.rope;
  const paged_kv_view<const T> kv = p.kv;
  const block_entry* blocks = p.table.entries + p.table.indptr[seq];
  std::int32_t num_blocks = p.table.indptr[seq + 1] - p.table.indptr[seq];
  const std::int32_t num_q_heads = p.num_q_heads;
  const std::size_t q_row = static_cast<std::size_t>(num_q_heads) * kv.head_dim;
  const float* q = p.q + static_cast<std::size_t>(q_first) * q_row;
  const pos_t* m = p.q_pos + q_first;
  float* out = p.out + static_cast<std::size_t>(q_first) * q_row;
  float* lse = p.lse == nullptr ? nullptr : p.lse + static_cast<std::size_t>(q_first) * num_q_heads;
  const float scale = p.scale;
  const int h_begin = p.heads.begin, h_end = std::min(p.heads.end, kv.num_kv_heads);
  const std::int32_t window = p.window;
  const int D = kv.head_dim, H = kv.num_kv_heads, G = num_q_heads / H, bs = kv.block_size;
  const int pairs = rope.pairs();
  const rope_layout layout = rope.config().layout;
  const float mag = static_cast<float>(rope.magnitude_factor());
  attention_scratch& w = scratch();
  const auto hq = static_cast<std::size_t>(num_q_heads), hd = static_cast<std::size_t>(D);
  const auto nqs = static_cast<std::size_t>(nq);
  w.qrot.resize(nqs * hq * hd);
  w.qblock.resize(hq * hd);
  w.kbuf.resize(static_cast<std::size_t>(bs) * hd);
  w.vbuf.resize(static_cast<std::size_t>(bs) * hd);
  w.kcos.resize(static_cast<std::size_t>(bs) * static_cast<std::size_t>(pairs));
  w.ksin.resize(w.kcos.size());
  w.acc.assign(nqs * hq * hd, 0.0f);
  const softmax_rows st = w.softmax(nqs * hq);
  w.scores.resize(static_cast<std::size_t>(bs));
  w.cs.resize(static_cast<std::size_t>(pairs));
  w.sn.resize(static_cast<std::size_t>(pairs));
  w.c0.resize(static_cast<std::size_t>(pairs));
  w.s0.resize(static_cast<std::size_t>(pairs));

  constexpr bool fast = Path::kSimd;
  // bf16 with VDPBF16PS: accumulators in bf16_acc_index order, restored at the end.
  constexpr bool bf16_dot = Path::kBf16Dot;
  // Prefill on the fast path: all rows that see a block-head at once (group_block_head, fp32
  // arithmetic; bf16 storage converted once per block and head).
  constexpr bool grouped = !Decode && fast;
  // The path's options, which depend on the RoPE table rather than on the path. The fast path
  // fuses the per-block query rotation (block_relative) when pairs never straddle a 16-lane
  // chunk: GPT-J always, NeoX when the whole head rotates.
  const bool fused_q = fast && (layout == rope_layout::kGPTJ || rope.config().rotary_dim == D);
  w.qcos.resize(hd);
  w.qsin.resize(hd);
  if constexpr (grouped) {
    w.ktile.resize(16 * hd);
    w.rows.resize(nqs * hq);
    w.live_rows.resize(nqs * hq);
  }
  if constexpr (bf16_dot) {
    w.kb16.resize(kRotHeads * 16 * hd);
    w.wb16.resize(16 * static_cast<std::size_t>(G));
    w.corr.resize(static_cast<std::size_t>(G));
  }

  // at_attention on the bf16 path, NeoX over the whole head: keys rotated with VDPBF16PS from
  // bf16 (cos, sin) pairs, query rows in bf16_acc_index order (see bf16_block_head).
  const bool rot_bf16 = P::kind == placement_kind::kAtAttention && bf16_dot && !grouped &&
                        layout == rope_layout::kNeoX && 2 * pairs == D;
  // Unit rotations R(j) of the slots of a block, for composing R(pos0 + j) = R(pos0) R(j).
  if constexpr (P::kind == placement_kind::kAtAttention) {
    w.jcos.resize(w.kcos.size());
    w.jsin.resize(w.kcos.size());
    for (int j = 0; j < bs; ++j)
      rope.angles(j, w.jcos.data() + static_cast<std::size_t>(j) * static_cast<std::size_t>(pairs),
                  w.jsin.data() + static_cast<std::size_t>(j) * static_cast<std::size_t>(pairs),
                  /*unit=*/true);
    if constexpr (bf16_dot) {
      if (rot_bf16) {
        w.krot.resize(2 * w.kcos.size());
        Path::slot_rotations(bs, pairs, mag, w.jcos.data(), w.jsin.data(), w.krot.data());
      }
    }
  }

  // Queries times the softmax scale (once, not per block), rotated at their positions for the
  // placements whose keys carry absolute rotations.
  for (std::size_t i = 0; i < nqs * hq * hd; ++i) w.qrot[i] = q[i] * scale;
  if ((P::kind != placement_kind::kBlockRelative || grouped) && !rot_bf16) {
    for (std::size_t i = 0; i < nqs; ++i) {
      rope.angles(m[i], w.cs.data(), w.sn.data());
      for (std::size_t h = 0; h < hq; ++h)
        rotate_inplace(w.qrot.data() + (i * hq + h) * hd, layout, pairs, w.cs.data(), w.sn.data());
    }
  }
  if constexpr (bf16_dot) {
    if (rot_bf16) {
      for (std::size_t r = 0; r < nqs * hq; ++r) {
        float* row = w.qrot.data() + r * hd;
        std::copy(row, row + hd, w.kbuf.begin());
        Path::acc_order(D, w.kbuf.data(), row);
      }
    }
  }
  const pos_t m_max = *std::max_element(m, m + nq);
  const pos_t m_min = *std::min_element(m, m + nq);

  // Prefill over bf16 KV on AMX (amx_bf16.hpp): the block loop packs each block-head's key
  // tiles, amx::attend runs after it.
  [[maybe_unused]] bool use_amx = false;
#if RELOKV_HOST_AMX
  amx::attention_tiles& at = amx::tiles_scratch();
  if constexpr (grouped && std::is_same_v<T, bf16>) {
    use_amx = amx::usable(D);  // windowed or not: the tiles mask the window (amx::attend)
    if (use_amx) amx::split_queries(at, w.qrot.data(), nq, num_q_heads, G, D, h_begin, h_end);
  }
#endif

  // R(m - pos0) for the placements that rotate the query per block, into w.cs/w.sn. Decode
  // walks blocks that usually follow each other: then R(m - pos0 - bs) = R(m - pos0) R(-bs) is
  // composed in fp32 instead of read from the table (a cache miss per block), re-read every
  // kChain blocks so that the error stays within a few ulp.
  constexpr int kChain = 8;
  int chain = kChain;
  pos_t chain_pos0 = 0;
  if (P::kind == placement_kind::kBlockRelative || rot_bf16) {
    w.stepc.resize(static_cast<std::size_t>(pairs));
    w.steps.resize(static_cast<std::size_t>(pairs));
    rope.angles(bs, w.stepc.data(), w.steps.data(), /*unit=*/true);
  }
  const auto query_angles = [&](std::int32_t bi, pos_t pos0, pos_t mq) {
    if (nq == 1 && chain < kChain && std::int64_t{pos0} - chain_pos0 == bs) {
      float* RELOKV_RESTRICT c = w.cs.data();
      float* RELOKV_RESTRICT sn = w.sn.data();
      const float* RELOKV_RESTRICT cb = w.stepc.data();
      const float* RELOKV_RESTRICT sb = w.steps.data();
      for (int i = 0; i < pairs; ++i) {
        const float ci = c[i], si = sn[i];
        c[i] = ci * cb[i] + si * sb[i];
        sn[i] = si * cb[i] - ci * sb[i];
      }
      ++chain;
    } else {
      rope.angles(std::int64_t{mq} - pos0, w.cs.data(), w.sn.data());
      chain = 0;
    }
    chain_pos0 = pos0;
    if (nq == 1 && bi + 1 < num_blocks &&
        (chain + 1 >= kChain || std::int64_t{blocks[bi + 1].pos0} - pos0 != bs))
      rope.prefetch(std::int64_t{mq} - blocks[bi + 1].pos0);
  };

  // Decode on the bf16 path: spans of up to kSpanChunks chunks per kernel call.
  if constexpr (bf16_dot && Decode) {
    // (Spans take no window: a windowed layer decodes block by block.)
    const bool spans = nq == 1 && window <= 0 &&
                       (P::kind == placement_kind::kPreRotated || rot_bf16 ||
                        (P::kind == placement_kind::kBlockRelative && fused_q));
    if (spans) {
      Path::template decode_spans<P>(kv, blocks, num_blocks, m[0], G, h_begin, h_end, layout, pairs,
                                     rot_bf16, query_angles, st, w);
      num_blocks = 0;  // all done; the output loop below normalizes
    }
  }
  for (std::int32_t bi = 0; bi < num_blocks; ++bi) {
    const block_entry e = blocks[bi];
    if (e.pos0 > m_max || e.len <= 0) continue;
    // Behind every query's sliding window (the earliest window starts past the block).
    if (window > 0 && window_first(e, m_min, window) >= e.len) continue;
    if (P::kind == placement_kind::kAtAttention && !rot_bf16) {
      // R(pos0 + j) = R(pos0) R(j): one table row per block, composed per slot, shared by all
      // KV heads and queries.
      const int rows = visible_slots(e, m_max);
      rope.angles(e.pos0, w.c0.data(), w.s0.data(), /*unit=*/true);
      if (nq == 1 && bi + 1 < num_blocks) rope.prefetch(blocks[bi + 1].pos0);
      const float* c0 = w.c0.data();
      const float* s0 = w.s0.data();
      for (int j = 0; j < rows; ++j) {
        const std::size_t row = static_cast<std::size_t>(j) * static_cast<std::size_t>(pairs);
        const float* cj = w.jcos.data() + row;
        const float* sj = w.jsin.data() + row;
        float* kc = w.kcos.data() + row;
        float* ks = w.ksin.data() + row;
        for (int i = 0; i < pairs; ++i) {
          kc[i] = mag * (c0[i] * cj[i] - s0[i] * sj[i]);
          ks[i] = mag * (s0[i] * cj[i] + c0[i] * sj[i]);
        }
      }
    }
    if constexpr (grouped) {
      // block_relative: (R(m) q) . (R(pos0) R(j) k), the queries rotated once per call and each
      // block's keys by R(pos0) as they are loaded: a block has fewer keys than a prefill
      // group has query rows.
      const float* qsrc = w.qrot.data();
      if constexpr (P::kind == placement_kind::kBlockRelative)
        rope.angles(e.pos0, w.c0.data(), w.s0.data(), /*unit=*/true);
#if RELOKV_HOST_AMX
      if constexpr (std::is_same_v<T, bf16>) {
        if (use_amx) {
          const int valid = visible_slots(e, m_max);
          for (int j0 = 0; j0 < valid; j0 += 16) {
            const int vc = std::min(16, valid - j0);
            const std::size_t k = at.add_tile(static_cast<pos_t>(e.pos0 + j0), vc);
            for (int h = h_begin; h < h_end; ++h) {
              block_head_t<T> bh{kv.k(e.block, h), kv.v(e.block, h), valid, h, G, D, layout, pairs,
                                 nullptr};
              if constexpr (P::kind == placement_kind::kBlockRelative) {
                bh.kc0 = w.c0.data();
                bh.ks0 = w.s0.data();
              }
              with_chunks(D, [&](auto dc) {
                amx::pack_key_tile<decltype(dc)::value, P>(bh, j0, vc, w, at.tile(h - h_begin, k));
              });
            }
          }
          continue;
        }
      }
#endif
      for (int h = h_begin; h < h_end; ++h) {
        int n = 0, vmax = 0, fmin = bs;
        for (int qi = 0; qi < nq; ++qi) {
          if (e.pos0 > m[qi]) continue;
          const int valid = visible_slots(e, m[qi]);
          const int first = window_first(e, m[qi], window);
          if (first >= valid) continue;  // all of the block is behind the query's window
          vmax = std::max(vmax, valid);
          fmin = std::min(fmin, first);
          for (int g = 0; g < G; ++g) {
            const std::size_t r =
                static_cast<std::size_t>(qi) * hq + static_cast<std::size_t>(h * G + g);
            w.rows[static_cast<std::size_t>(n++)] = {qsrc + r * hd, w.acc.data() + r * hd,
                                                     st.from(r), valid, first};
          }
        }
        if (n == 0) continue;
        block_head_t<T> bh{kv.k(e.block, h), kv.v(e.block, h), vmax, h, G, D, layout, pairs,
                           nullptr};
        bh.first = fmin;
        if constexpr (P::kind == placement_kind::kBlockRelative) {
          bh.kc0 = w.c0.data();
          bh.ks0 = w.s0.data();
        }
        Path::template group<P>(bh, w.rows.data(), n, w);
      }
      continue;
    }
    for (int qi = 0; qi < nq; ++qi) {
      const pos_t mq = m[qi];
      if (e.pos0 > mq) continue;
      const int valid = visible_slots(e, mq);
      const int first = window_first(e, mq, window);
      if (first >= valid) continue;  // all of the block is behind the query's window
      const auto qoff = static_cast<std::size_t>(qi) * hq;
      // Scaled query rows; unrotated for block_relative, which rotates them per block below.
      const float* qsrc = w.qrot.data() + qoff * hd;
      const float* qcos = nullptr;
      const float* qsin = nullptr;
      if constexpr (P::kind == placement_kind::kBlockRelative) {
        // (R(m) q) . (R(pos0 + j) k) = (R(m - pos0) q) . (R(j) k): one rotation per block. The
        // fast path rotates each query chunk as it loads it; otherwise rotate a copy here.
        query_angles(bi, e.pos0, mq);
        if (fused_q && layout == rope_layout::kNeoX) {  // the pair rows as they are
          qcos = w.cs.data();
          qsin = w.sn.data();
        } else if (fused_q) {
          expand_rotation(layout, pairs, D, w.cs.data(), w.sn.data(), w.qcos.data(), w.qsin.data());
          qcos = w.qcos.data();
          qsin = w.qsin.data();
        } else {
          std::copy(qsrc, qsrc + hq * hd, w.qblock.begin());
          for (std::size_t h = 0; h < hq; ++h)
            rotate_inplace(w.qblock.data() + h * hd, layout, pairs, w.cs.data(), w.sn.data());
          qsrc = w.qblock.data();
        }
      } else if constexpr (bf16_dot) {
        if (rot_bf16) {
          // The same per-block query rotation, its pair rows in the query's bf16_acc_index
          // order (which keeps pair (i, i + D/2) at positions (p, p + D/2), p < D/2).
          query_angles(bi, e.pos0, mq);
          Path::acc_order(pairs, w.cs.data(), w.qcos.data());
          Path::acc_order(pairs, w.sn.data(), w.qsin.data());
          qcos = w.qcos.data();
          qsin = w.qsin.data();
        }
      }
      for (int h = h_begin; h < h_end; ++h) {
        block_head_t<T> bh{
            kv.k(e.block, h), kv.v(e.block, h), valid, h, G, D, layout, pairs, qsrc, qcos, qsin};
        bh.first = first;
        bh.acc = w.acc.data() + qoff * hd;
        bh.sm = st.from(qoff);
        if (rot_bf16) bh.krot = w.krot.data();
        // Decode: the next block's share for this head streams in while this one computes.
        if (Decode && qi == 0 && bi + 1 < num_blocks) {
          const std::size_t slice = 2 * static_cast<std::size_t>(kv.tile_elems()) * sizeof(T);
          bh.pf = reinterpret_cast<const char*>(kv.k(blocks[bi + 1].block, 0)) +
                  slice * static_cast<std::size_t>(h);
          bh.pf_bytes = static_cast<std::int32_t>(slice);
        }
        Path::template block_head<P>(bh, w);
      }
    }
  }
#if RELOKV_HOST_AMX
  if (use_amx) amx::attend(at, m, nq, num_q_heads, G, h_begin, w.acc.data(), st, window);
#endif
  for (std::size_t i = 0; i < nqs * hq; ++i) {
    const auto head = static_cast<int>(i % hq);
    if (head < h_begin * G || head >= h_end * G) continue;  // another call's share
    const float inv = st.inverse(i);                        // no visible key: zeros
    if (lse != nullptr) lse[i] = st.lse(i, host_log{});
    const float* acc = w.acc.data() + i * hd;
    if constexpr (bf16_dot && !grouped) {  // the bf16 kernels' accumulator order
      for (int d = 0; d < D; ++d)
        out[i * hd + static_cast<std::size_t>(d)] = acc[Path::acc_index(d)] * inv;
    } else {
      for (std::size_t d = 0; d < hd; ++d) out[i * hd + d] = acc[d] * inv;
    }
  }
}

}  // namespace detail
RELOKV_NAMESPACE_END
