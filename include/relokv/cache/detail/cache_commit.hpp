#pragma once
/// @file
/// relocatable_cache::commit_impl and the provenance marking of the blocks a request registers
/// (mark_canonical). Included by relocatable_cache.hpp; not a header of its own.
#include "relokv/cache/relocatable_cache.hpp"

RELOKV_NAMESPACE_BEGIN

template <class HashScheme, class BlockAllocator, class RopePlacement, class RecomputeStrategy,
          class KvStore>
template <class Storage>
void relocatable_cache<HashScheme, BlockAllocator, RopePlacement, RecomputeStrategy,
                       KvStore>::commit_impl(request_id id, const Storage* storage) {
  request_state& rs = state_of(id, "commit");
  if (rs.committed) throw error("commit: request " + std::to_string(id) + " already committed");
  rs.committed = true;
  // Context entries may have died since plan() and their slots been reused for another
  // context: re-derive them (by tokens and extra keys, never by slot) before linking.
  for (std::size_t s = 0; s < rs.segments.size(); ++s)
    rs.segment_entry[s] =
        detail::relocatable(rs.segments[s]) ? contexts_.find(rs, static_cast<std::int32_t>(s)) : -1;
  const auto nb = rs.blocks.size();
  mark_canonical(rs);
  for (std::size_t bi = 0; bi < nb; ++bi) {
    const planned_block& pb = rs.plan_blocks[bi];
    const block_extent& e = rs.blocks[bi];
    // What the request registers: the blocks it wrote whole, and those it fetched.
    const block_id reg = pb.fresh                        ? pb.physical
                         : pb.tier == block_tier::kStore ? pb.source
                                                         : kNoBlock;
    if (reg == kNoBlock || !e.sealed) continue;
    const segment& seg = rs.segments[static_cast<std::size_t>(e.segment)];
    const auto b = static_cast<std::int32_t>(bi);
    block_meta& m = meta_[static_cast<std::size_t>(reg)];
    m.len = e.len;
    m.tag = block_tag(seg, b == seg.first_block);
    m.stored_pos0 = pb.fresh ? e.pos0 : rs.src_pos0[bi];
    m.extras = rs.extras;
    m.origin = origin_of(rs, bi);
    std::copy_n(rs.tokens.begin() + e.pos0, e.len, block_tokens(reg));
    bool cached = false;
    // Children link to the indexed copy of their parent when there is one (the canonical
    // block), so that a duplicate computed concurrently does not orphan them when it is freed.
    if (rs.exact[bi]) {
      m.ctx_parent = bi == 0 ? kNoBlock : rs.ctx_link[bi - 1];
      m.ctx_parent_gen = bi == 0 ? 0 : meta_of(m.ctx_parent).generation;
      const auto [it, inserted] = ctx_index_.try_emplace(rs.context_key[bi], reg);
      if (inserted) {
        m.in_ctx = true;
        m.ctx_key = rs.context_key[bi];
        cached = true;
      } else if (verify_chain(rs, b, it->second, true)) {
        rs.ctx_link[bi] = it->second;
      }
    }
    if (detail::relocatable(seg)) {
      // Content links are recorded even when the key is taken, so that a chain walk through
      // this block (reached as an exact parent) can still prove the span's content.
      const bool first = b == seg.first_block;
      if (first) {
        const std::int32_t entry = contexts_.intern(rs, e.segment);
        m.content_parent = kNoBlock;
        m.context_entry = entry;
        if (entry >= 0) contexts_.retain(entry);
      } else {
        m.content_parent = rs.content_link[bi - 1];
        m.content_parent_gen = meta_of(m.content_parent).generation;
      }
      if (!first || m.context_entry >= 0) {
        const auto [it, inserted] = content_index_.try_emplace(rs.content_key[bi], reg);
        if (inserted) {
          m.in_content = true;
          m.content_key = rs.content_key[bi];
          cached = true;
        } else if (verify_chain(rs, b, it->second, false)) {
          block_meta& held = meta_of(it->second);
          if (m.origin.canonical && !serves(provenance_, held.origin, rs.principal)) {
            // A canonical compilation replaces K/V computed after other text that the policy
            // kept from this request: from now on every principal can reuse the span (the
            // replaced block keeps its chain links).
            held.in_content = false;
            it->second = reg;
            m.in_content = true;
            m.content_key = rs.content_key[bi];
            cached = true;
          } else {
            rs.content_link[bi] = it->second;
          }
        }
      }
    }
    if (cached) alloc_.set_cached(reg, true);
  }
  if constexpr (kHasStore && !std::is_same_v<Storage, no_block_io>) {
    if (tier_.opts.write) tier_.write(rs, *storage, stats_, block_size_, RopePlacement::kind);
  }
}

template <class HashScheme, class BlockAllocator, class RopePlacement, class RecomputeStrategy,
          class KvStore>
void relocatable_cache<HashScheme, BlockAllocator, RopePlacement, RecomputeStrategy,
                       KvStore>::mark_canonical(request_state& rs) const {
  bool all_before = true;  // every block before the current segment's first is canonical
  bool segment_ctx = true;
  for (std::size_t bi = 0; bi < rs.blocks.size(); ++bi) {
    const planned_block& pb = rs.plan_blocks[bi];
    const block_extent& e = rs.blocks[bi];
    const segment& seg = rs.segments[static_cast<std::size_t>(e.segment)];
    const auto b = static_cast<std::int32_t>(bi);
    if (b == seg.first_block) segment_ctx = all_before;
    // In place: the segment starts right after its own context, that context's K/V were
    // canonical, and (for a span_context) that context is what actually precedes it.
    const auto ctx = detail::context_tokens(rs, e.segment);
    const bool in_place =
        segment_ctx && (b == seg.first_block || rs.canonical[bi - 1] != 0) &&
        (!detail::relocatable(seg) || (static_cast<std::int32_t>(ctx.size()) == seg.first_token &&
                                       (!rs.has_span_context || seg.kind != segment_kind::kSpan ||
                                        std::equal(ctx.begin(), ctx.end(), rs.tokens.begin()))));
    bool c = in_place;
    if (!pb.fresh) {
      const bool source = pb.tier == block_tier::kStore ? rs.fetched_origin[bi].canonical
                          : pb.source == kNoBlock       ? false
                                                        : meta_of(pb.source).origin.canonical;
      c = source && (!pb.copy_on_write || in_place);
    }
    rs.canonical[bi] = c ? 1 : 0;
    all_before = all_before && c;
  }
}

RELOKV_NAMESPACE_END
