#pragma once
/// @file
/// relocatable_cache::plan_into: one request's plan (lookups by context key, then content key;
/// the strategy's mask; blocks taken, copies and store fetches). Included by
/// relocatable_cache.hpp; not a header of its own.
#include "relokv/cache/relocatable_cache.hpp"

RELOKV_NAMESPACE_BEGIN

namespace detail {
/// A layout that reads an adapter's learned rows keys every block under that adapter.
inline extra_keys keys_under_adapter(const request_layout& layout, const extra_keys& extras) {
  extra_keys x = extras;
  if (layout.adapter_id != 0) {
    if (extras.adapter_id != 0 && extras.adapter_id != layout.adapter_id)
      throw error("plan: extra_keys.adapter_id " + std::to_string(extras.adapter_id) +
                  " differs from the layout's adapter " + std::to_string(layout.adapter_id));
    x.adapter_id = layout.adapter_id;
  }
  return x;
}
}  // namespace detail

template <class HashScheme, class BlockAllocator, class RopePlacement, class RecomputeStrategy,
          class KvStore>
void relocatable_cache<HashScheme, BlockAllocator, RopePlacement, RecomputeStrategy,
                       KvStore>::plan_into(const request_layout& layout,
                                           const RecomputeStrategy& strategy,
                                           const extra_keys& extras, reuse_plan& p,
                                           std::uint64_t principal) {
  p.id = kNoRequest;
  p.exact_hits = p.relocated_hits = p.misses = p.tokens_to_compute = p.store_hits = 0;
  p.fetches.clear();
  check_request(layout, "plan");
  const extra_keys x = detail::keys_under_adapter(layout, extras);
  const std::int32_t nb = layout.num_blocks();
  derive_block_keys(hash_, layout, x, keys_);
  request_state& rs = new_state();
  rs.extras = x;
  rs.principal = principal;
  rs.tokens.assign(layout.tokens.begin(), layout.tokens.end());
  rs.blocks.assign(layout.blocks.begin(), layout.blocks.end());
  rs.segments.assign(layout.segments.begin(), layout.segments.end());
  rs.has_span_context = layout.span_context.has_value();
  if (layout.span_context)
    rs.span_context.assign(layout.span_context->begin(), layout.span_context->end());
  else
    rs.span_context.clear();
  rs.context_key = keys_.context;
  rs.content_key = keys_.content;
  rs.segment_context = keys_.segment_context;
  rs.ident.assign(static_cast<std::size_t>(nb), kNoBlock);
  rs.exact.assign(static_cast<std::size_t>(nb), 0);
  rs.canonical.assign(static_cast<std::size_t>(nb), 0);
  if constexpr (kHasStore) {
    rs.src_pos0.assign(static_cast<std::size_t>(nb), 0);
    rs.keep_out.assign(static_cast<std::size_t>(nb), 0);
    rs.fetched_origin.assign(static_cast<std::size_t>(nb), block_origin{});
    rs.id_ready = false;
  }
  rs.held.clear();

  // Context identities of relocatable segments, verified by their tokens.
  rs.segment_entry.assign(layout.segments.size(), -1);
  for (std::size_t s = 0; s < layout.segments.size(); ++s)
    if (detail::relocatable(layout.segments[s]))
      rs.segment_entry[s] = contexts_.find(rs, static_cast<std::int32_t>(s));

  p.status = plan_status::kOk;
  p.blocks_short = 0;
  p.copies.clear();
  p.blocks.assign(static_cast<std::size_t>(nb), planned_block{});
  status_.assign(static_cast<std::size_t>(nb), block_status::kMiss);
  p.compute.assign(layout.tokens.size(), 0);

  // 1. Lookup.
  bool chain_exact = true;
  std::int64_t denied = 0;
  for (std::int32_t b = 0; b < nb; ++b) {
    const auto bi = static_cast<std::size_t>(b);
    const block_extent& e = layout.blocks[bi];
    const segment& seg = layout.segments[static_cast<std::size_t>(e.segment)];
    planned_block& pb = p.blocks[bi];
    pb.pos0 = e.pos0;
    pb.len = e.len;
    block_id hit = kNoBlock;
    if (e.sealed && chain_exact) {
      hit = lookup(ctx_index_, keys_.context[bi]);
      if (hit != kNoBlock && !verify_chain(rs, b, hit, true)) hit = kNoBlock;
      if (hit != kNoBlock) status_[bi] = block_status::kExactHit;
    }
    if (hit == kNoBlock && e.sealed && detail::relocatable(seg)) {
      hit = lookup(content_index_, keys_.content[bi]);
      if (hit != kNoBlock && !verify_chain(rs, b, hit, false)) hit = kNoBlock;
      if (hit != kNoBlock && !serves(provenance_, meta_of(hit).origin, principal)) {
        hit = kNoBlock;
        ++denied;
      }
      if (hit != kNoBlock) status_[bi] = block_status::kRelocatedHit;
    }
    // Exact lookups continue only along an unbroken chain of exact hits: the chain walk's
    // shortcut (parent == the block resolved for b-1) is a proof only for exact parents.
    if (status_[bi] != block_status::kExactHit) chain_exact = false;
    pb.physical = hit;
    pb.source = hit;
    pb.status = status_[bi];
    pb.tier = hit == kNoBlock ? block_tier::kComputed : block_tier::kPool;
    rs.ident[bi] = hit;
    if (status_[bi] == block_status::kMiss)
      std::fill_n(p.compute.begin() + e.pos0, e.len, std::uint8_t{1});
  }
  if constexpr (kHasStore) {
    if (tier_.opts.read)
      tier_.fetch(layout, strategy, rs, p, status_, stats_, block_size_, RopePlacement::kind,
                  provenance_);
  }

  // 2. Strategy.
  strategy.select(layout, std::span<const block_status>(status_), std::span(p.compute));

  // 3. Decide fresh / shared / copy-on-write, and count what must be allocated.
  std::int32_t need = 0, hits_now_free = 0;
  for (std::int32_t b = 0; b < nb; ++b) {
    const auto bi = static_cast<std::size_t>(b);
    planned_block& pb = p.blocks[bi];
    const block_extent& e = layout.blocks[bi];
    const auto first = p.compute.begin() + e.pos0;
    const std::int32_t computed = detail::count_ones(&*first, e.len);
    // A dynamic or probing strategy's first mask is only its candidates: its reused tokens
    // mostly stay, so their blocks are copied, never rebuilt from nothing.
    pb.fresh = pb.status == block_status::kMiss || (computed == e.len && !narrows_mask(strategy));
    pb.copy_on_write = !pb.fresh && (computed > 0 || needs_rotation(pb, src_pos0_of(rs, bi, pb)));
    // A fetch the request recomputes whole is not written at all.
    if (pb.fresh) pb.tier = block_tier::kComputed;
    // Hits the request reads are held; a hit it recomputes whole only names its source.
    if (pb.tier == block_tier::kPool) {
      if (alloc_.ref_count(pb.physical) == 0 && !counted_free(pb.physical)) ++hits_now_free;
    }
    // A fetched block takes a block for its bytes (and another for a private copy).
    if constexpr (kHasStore) need += pb.tier == block_tier::kStore ? 1 : 0;
    if (pb.fresh || pb.copy_on_write) ++need;
  }
  clear_counted(p);
  if (alloc_.num_free() - hits_now_free < need) {
    p.status = plan_status::kOutOfBlocks;
    p.blocks_short = need - (alloc_.num_free() - hits_now_free);
    ++stats_.out_of_blocks;
    free_states_.push_back(rs_index_);
    return;
  }

  // 4. Take the blocks: shared ones first (so that allocation cannot evict them).
  for (planned_block& pb : p.blocks)
    if (pb.tier == block_tier::kPool) {
      alloc_.retain(pb.physical);
      rs.held.push_back(pb.physical);
    }
  bool exact_so_far = true;
  for (std::int32_t b = 0; b < nb; ++b) {
    const auto bi = static_cast<std::size_t>(b);
    planned_block& pb = p.blocks[bi];
    if constexpr (kHasStore) {
      if (pb.tier == block_tier::kStore) {
        // The fetched bytes go into a block of their own, which commit registers.
        const block_id dst = take_block(rs);
        pb.physical = pb.source = dst;
        rs.ident[bi] = dst;
        tier_.fetched[bi].dst = dst;
        p.fetches.push_back(std::move(tier_.fetched[bi]));
        ++p.store_hits;
      }
    }
    const block_id shared = pb.physical;
    if (pb.fresh || pb.copy_on_write) {
      const block_id mine = take_block(rs);
      pb.physical = mine;
      if (pb.copy_on_write) p.copies.push_back({shared, mine, src_pos0_of(rs, bi, pb), pb.pos0});
      // A block the request writes whole is what its successors chain to from now on (for a
      // hit recomputed whole, not the cached source it was found in).
      if (pb.fresh) rs.ident[bi] = mine;
    }
    exact_so_far =
        exact_so_far && (pb.status == block_status::kExactHit ? !pb.copy_on_write : pb.fresh);
    rs.exact[bi] = exact_so_far ? 1 : 0;
  }

  p.exact_hits = p.relocated_hits = p.misses = 0;
  for (const planned_block& pb : p.blocks) {
    p.exact_hits += pb.status == block_status::kExactHit;
    p.relocated_hits += pb.status == block_status::kRelocatedHit;
    p.misses += pb.status == block_status::kMiss;
  }
  p.tokens_to_compute =
      detail::count_ones(p.compute.data(), static_cast<std::int32_t>(p.compute.size()));
  rs.plan_blocks.assign(p.blocks.begin(), p.blocks.end());
  rs.ctx_link = rs.ident;
  rs.content_link = rs.ident;
  rs.live = true;
  p.id = next_id_++;
  live_.emplace(p.id, rs_index_);
  ++stats_.requests;
  stats_.blocks_looked_up += nb;
  stats_.exact_hits += p.exact_hits;
  stats_.relocated_hits += p.relocated_hits;
  stats_.misses += p.misses;
  stats_.store_hits += p.store_hits;
  stats_.provenance_denied += denied;
}

template <class HashScheme, class BlockAllocator, class RopePlacement, class RecomputeStrategy,
          class KvStore>
void relocatable_cache<HashScheme, BlockAllocator, RopePlacement, RecomputeStrategy,
                       KvStore>::store_keys(const request_layout& layout,
                                            const RecomputeStrategy& strategy,
                                            const extra_keys& extras, std::vector<store_key>& out,
                                            std::uint64_t principal) const {
  out.clear();
  check_request(layout, "store_keys");
  if constexpr (kHasStore) {
    if (!tier_.opts.read) return;
    const extra_keys x = detail::keys_under_adapter(layout, extras);
    block_keys<HashScheme> keys;
    derive_block_keys(hash_, layout, x, keys);
    const auto nb = static_cast<std::size_t>(layout.num_blocks());
    std::vector<block_status> status(nb, block_status::kMiss);
    std::vector<std::uint8_t> compute(layout.tokens.size(), 0);
    // Step 1 of the plan without its verification: what the pool holds under these keys.
    bool chain_exact = true;
    for (std::size_t b = 0; b < nb; ++b) {
      const block_extent& e = layout.blocks[b];
      const segment& seg = layout.segments[static_cast<std::size_t>(e.segment)];
      if (e.sealed && chain_exact && lookup(ctx_index_, keys.context[b]) != kNoBlock)
        status[b] = block_status::kExactHit;
      if (status[b] == block_status::kMiss && e.sealed && detail::relocatable(seg)) {
        const block_id hit = lookup(content_index_, keys.content[b]);
        if (hit != kNoBlock && serves(provenance_, meta_of(hit).origin, principal))
          status[b] = block_status::kRelocatedHit;
      }
      if (status[b] != block_status::kExactHit) chain_exact = false;
      if (status[b] == block_status::kMiss)
        std::fill_n(compute.begin() + e.pos0, e.len, std::uint8_t{1});
    }
    std::vector<block_status> spec_status;
    std::vector<std::uint8_t> spec_mask;
    std::vector<std::size_t> blocks;
    detail::store_tier<KvStore>::fetch_candidates(
        layout, strategy, std::span<const block_status>(status),
        std::span<const std::uint8_t>(compute), spec_status, spec_mask, blocks, nullptr);
    for (const std::size_t b : blocks)
      out.push_back(
          tier_.key_of(detail::store_tier<KvStore>::kind_of(layout.segments, layout.blocks[b]), x,
                       keys.content[b], keys.context[b], block_size_));
  } else {
    (void)strategy;
    (void)extras;
    (void)principal;
  }
}

RELOKV_NAMESPACE_END
