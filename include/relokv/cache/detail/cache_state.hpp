#pragma once
/// @file
/// relocatable_cache's bookkeeping: what it remembers of a block, of an interned context and
/// of a live request, and the small queries on them that the plan and the store tier share.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "relokv/block_table.hpp"
#include "relokv/cache/reuse_plan.hpp"
#include "relokv/hash/block_keys.hpp"
#include "relokv/layout/request_layout.hpp"
#include "relokv/store/sha256.hpp"
#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN
namespace detail {

/// A block of the pool: its keys, its parents (checked by generation), what it holds.
template <class Key>
struct block_meta {
  Key ctx_key{};
  Key content_key{};
  std::uint32_t generation = 0;
  std::uint32_t ctx_parent_gen = 0;
  std::uint32_t content_parent_gen = 0;
  std::uint32_t tag = 0;
  block_id ctx_parent = kNoBlock;      ///< kNoBlock: first block of a request (root)
  block_id content_parent = kNoBlock;  ///< kNoBlock: first block of a span (context_entry)
  std::int32_t context_entry = -1;
  std::int32_t len = 0;
  pos_t stored_pos0 = 0;
  extra_keys extras{};
  block_origin origin{};
  bool in_ctx = false;
  bool in_content = false;
};
/// An interned context (a span's prefix, or a dependent segment's window) and extra keys.
template <class Key>
struct context_entry {
  Key key{};
  std::vector<token_t> tokens;
  extra_keys extras{};
  std::int32_t refs = 0;
  bool live = false;
};
/// A live request: its layout, keys, plan and the blocks it holds.
template <class Key>
struct request_state {
  bool live = false;
  bool committed = false;
  extra_keys extras{};
  std::uint64_t principal = 0;
  std::vector<token_t> tokens;
  std::vector<block_extent> blocks;
  std::vector<segment> segments;
  bool has_span_context = false;      ///< request_layout::span_context is set
  std::vector<token_t> span_context;  ///< its tokens
  std::vector<Key> context_key, content_key, segment_context;
  std::vector<std::int32_t> segment_entry;
  std::vector<planned_block> plan_blocks;
  std::vector<block_id> ident;  ///< per block: the shared block that holds its content
  std::vector<block_id> ctx_link, content_link;  ///< parents that commit links children to
  std::vector<std::uint8_t> exact;
  std::vector<pos_t> src_pos0;         ///< per hit: the position its keys were written at
  std::vector<std::uint8_t> keep_out;  ///< per block: not written to the store
  /// Per block: whether its K/V are canonical (block_origin), for the blocks after it.
  std::vector<std::uint8_t> canonical;
  std::vector<block_origin> fetched_origin;  ///< per fetched block: its stored origin
  std::vector<sha256_digest> id_before;      ///< per block: its identity digest (store tier)
  bool id_ready = false;
  std::vector<block_id> held;
};

/// Ones in a 0/1 mask (a plain sum, which vectorizes; std::count does not here).
inline std::int32_t count_ones(const std::uint8_t* m, std::int32_t n) noexcept {
  std::int32_t s = 0;
  for (std::int32_t i = 0; i < n; ++i) s += m[i];
  return s;
}

/// Whether a segment's blocks are reusable at another position (keyed by content).
inline bool relocatable(const segment& s) noexcept {
  return s.kind == segment_kind::kSpan || (s.kind == segment_kind::kDependent && s.dep_window > 0);
}

/// The tokens a segment's content key depends on: the prefix (or the layout's span_context)
/// for a span, the window before a dependent segment.
template <class Key>
std::span<const token_t> context_tokens(const request_state<Key>& rs, std::int32_t s) {
  const segment& seg = rs.segments[static_cast<std::size_t>(s)];
  if (seg.kind == segment_kind::kSpan) {
    if (rs.has_span_context) return rs.span_context;
    if (rs.segments.front().kind != segment_kind::kPrefix) return {};
    return std::span<const token_t>(rs.tokens).first(
        static_cast<std::size_t>(rs.segments.front().num_tokens));
  }
  const std::int32_t n = std::min(seg.dep_window, seg.first_token);
  return std::span<const token_t>(rs.tokens).subspan(static_cast<std::size_t>(seg.first_token - n),
                                                     static_cast<std::size_t>(n));
}

}  // namespace detail
RELOKV_NAMESPACE_END
