#pragma once
/// @file
/// A layer of paged KV that carries the RoPE placement its keys were written with, so that the
/// helpers which write and read it take the placement from the view: a view of an at_attention
/// cache handed to append_kv<pre_rotated> does not compile, where a bare paged_kv_view would
/// run and give wrong attention. request_kv::layer (engine/request_kv.hpp) gives these.
#include <cstdint>
#include <type_traits>

#include "relokv/attention/decode.hpp"
#include "relokv/attention/kv_append.hpp"
#include "relokv/attention/prefill.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/memory/paged_view.hpp"

RELOKV_NAMESPACE_BEGIN

/// paged_kv_view<T> tagged with placement P. It converts to nothing implicitly: the bare view
/// is `.kv`, for a caller who takes the placement in hand.
template <class P, class T>
struct placed_kv_view {
  static_assert(rope_placement<P>, "P must model relokv::rope_placement");
  using placement = P;
  paged_kv_view<T> kv;
};

/// append_kv with the view's placement.
template <class P, class T>
void append_kv(const rope_table& rope, placed_kv_view<P, T> kv, block_id block, std::int32_t slot,
               pos_t pos, const float* k, const float* v) {
  append_kv<P>(rope, kv.kv, block, slot, pos, k, v);
}

/// decode_attention with the view's placement.
template <class P, class T>
void decode_attention(const rope_table& rope, placed_kv_view<P, T> kv, block_table_view table,
                      const float* q, const pos_t* q_pos, std::int32_t num_q_heads, float scale,
                      float* out, kv_head_range heads = {}, float* lse = nullptr) {
  decode_attention<P>(rope, paged_kv_view<const std::remove_const_t<T>>(kv.kv), table, q, q_pos,
                      num_q_heads, scale, out, heads, lse);
}

/// prefill_attention with the view's placement.
template <class P, class T>
void prefill_attention(const rope_table& rope, placed_kv_view<P, T> kv, block_table_view table,
                       const float* q, const pos_t* q_pos, const std::int32_t* q_indptr,
                       std::int32_t num_q_heads, float scale, float* out, kv_head_range heads = {},
                       float* lse = nullptr) {
  prefill_attention<P>(rope, paged_kv_view<const std::remove_const_t<T>>(kv.kv), table, q, q_pos,
                       q_indptr, num_q_heads, scale, out, heads, lse);
}

RELOKV_NAMESPACE_END
