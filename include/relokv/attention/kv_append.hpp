#pragma once
/// @file
/// Writing new K/V into paged storage as the RoPE placement requires, and relocating
/// pre-rotated blocks.
#include <cstdint>
#include <span>
#include <string>

#include "relokv/block_table.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/dtype.hpp"
#include "relokv/memory/host_kv_storage.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/layer_rope.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN

namespace detail {
/// The rotation covers exactly the view's rows, and a row fits the kernels' staging buffers.
template <class T>
void check_rope_head_dim(const char* what, const rope_table& rope, const paged_kv_view<T>& kv) {
  if (kv.head_dim <= 0 || kv.head_dim > kMaxHeadDim || rope.config().head_dim != kv.head_dim)
    throw error(std::string(what) + ": KV head_dim " + std::to_string(kv.head_dim) +
                " must equal the rope's (" + std::to_string(rope.config().head_dim) +
                ") and lie in [1, " + std::to_string(kMaxHeadDim) + "]");
}
}  // namespace detail

/// Writes one token's K and V (all KV heads) into slot `slot` of `block`. K arrives unrotated
/// and is stored rotated by P::stored_position(pos, slot): at pos (pre_rotated), not at all
/// (at_attention) or by its slot (block_relative).
/// @param k, v  [num_kv_heads][head_dim]
template <class P, class T>
void append_kv(const rope_table& rope, paged_kv_view<T> kv, block_id block, std::int32_t slot,
               pos_t pos, const float* k, const float* v) {
  static_assert(rope_placement<P>, "P must model relokv::rope_placement");
  if (block < 0 || block >= kv.num_blocks || slot < 0 || slot >= kv.block_size)
    throw error("append_kv: block " + std::to_string(block) + " slot " + std::to_string(slot) +
                " outside the pool");
  detail::check_rope_head_dim("append_kv", rope, kv);
  const std::int32_t D = kv.head_dim;
  const pos_t rot = P::stored_position(pos, slot);
  float buf[kMaxHeadDim];
  for (std::int32_t h = 0; h < kv.num_kv_heads; ++h) {
    const float* kh = k + static_cast<std::ptrdiff_t>(h) * D;
    for (std::int32_t d = 0; d < D; ++d) buf[d] = kh[d];
    if constexpr (P::kind != placement_kind::kAtAttention) rope.rotate(buf, rot);
    T* kd = kv.k(block, h) + static_cast<std::ptrdiff_t>(slot) * D;
    T* vd = kv.v(block, h) + static_cast<std::ptrdiff_t>(slot) * D;
    const float* vh = v + static_cast<std::ptrdiff_t>(h) * D;
    for (std::int32_t d = 0; d < D; ++d) {
      kd[d] = from_f32<T>(buf[d]);
      vd[d] = from_f32<T>(vh[d]);
    }
  }
}

/// Copies `len` slots of block src into dst in one layer, rotating keys by `delta` positions
/// (pre_rotated relocation; V is copied unchanged). In bf16/fp16 the rotated key is rounded
/// again: one more half-ulp per relocation.
template <class T>
void relocate_block(const rope_table& rope, paged_kv_view<T> kv, block_id src, block_id dst,
                    pos_t delta, std::int32_t len) {
  detail::check_rope_head_dim("relocate_block", rope, kv);
  if (src < 0 || src >= kv.num_blocks || dst < 0 || dst >= kv.num_blocks || len < 0 ||
      len > kv.block_size)
    throw error("relocate_block: blocks " + std::to_string(src) + " -> " + std::to_string(dst) +
                " (len " + std::to_string(len) + ") outside the pool of " +
                std::to_string(kv.num_blocks) + " blocks of " + std::to_string(kv.block_size));
  const std::int32_t D = kv.head_dim;
  const std::int32_t pairs = rope.pairs();
  float cs[kMaxHeadDim / 2], sn[kMaxHeadDim / 2], buf[kMaxHeadDim];
  rope.angles(delta, cs, sn, /*unit=*/true);
  for (std::int32_t h = 0; h < kv.num_kv_heads; ++h) {
    const T* ks = kv.k(src, h);
    T* kd = kv.k(dst, h);
    for (std::int32_t j = 0; j < len; ++j) {
      for (std::int32_t d = 0; d < D; ++d) buf[d] = to_f32(ks[j * D + d]);
      rotate_inplace(buf, rope.config().layout, pairs, cs, sn);
      for (std::int32_t d = 0; d < D; ++d) kd[j * D + d] = from_f32<T>(buf[d]);
    }
    const T* vs = kv.v(src, h);
    T* vd = kv.v(dst, h);
    for (std::int64_t i = 0; i < kv.tile_elems(); ++i) vd[i] = vs[i];
  }
}

/// Performs a reuse plan's copies on every layer of a host pool: plain copies for the
/// placements that relocate for free, copies with a delta rotation for pre_rotated.
template <class P, class T>
void apply_copies(const rope_table& rope, host_kv_storage<T>& storage,
                  std::span<const block_copy> copies) {
  for (const block_copy& c : copies) {
    if (P::relocation_rotates_keys && c.rotates()) {
      for (std::int32_t l = 0; l < storage.shape().num_layers; ++l)
        relocate_block(rope, storage.layer(l), c.src, c.dst, c.dst_pos0 - c.src_pos0,
                       storage.shape().block_size);
    } else {
      storage.copy_block(c.src, c.dst);
    }
  }
}

/// apply_copies for a model whose layers rotate by their own RoPE (layer_rope): a pre_rotated
/// relocation rotates each layer's keys by the delta in that layer's base.
template <class P, class T>
void apply_copies(const layer_rope& layers, host_kv_storage<T>& storage,
                  std::span<const block_copy> copies) {
  if (layers.num_layers() != storage.shape().num_layers)
    throw error("apply_copies: " + std::to_string(layers.num_layers()) + " layers of RoPE for " +
                std::to_string(storage.shape().num_layers) + " layers of KV");
  for (const block_copy& c : copies) {
    if (P::relocation_rotates_keys && c.rotates()) {
      for (std::int32_t l = 0; l < storage.shape().num_layers; ++l)
        relocate_block(layers.table(l), storage.layer(l), c.src, c.dst, c.dst_pos0 - c.src_pos0,
                       storage.shape().block_size);
    } else {
      storage.copy_block(c.src, c.dst);
    }
  }
}

RELOKV_NAMESPACE_END
