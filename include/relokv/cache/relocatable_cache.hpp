#pragma once
/// @file
/// The policy host: plans reuse, registers new blocks, ends requests.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "relokv/cache/cache_stats.hpp"
#include "relokv/cache/detail/cache_state.hpp"
#include "relokv/cache/detail/context_table.hpp"
#include "relokv/cache/detail/store_tier.hpp"
#include "relokv/cache/reuse_plan.hpp"
#include "relokv/concepts/block_allocator.hpp"
#include "relokv/concepts/hash_scheme.hpp"
#include "relokv/concepts/kv_store.hpp"
#include "relokv/concepts/recompute_strategy.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/hash/block_keys.hpp"
#include "relokv/hash/xxh3.hpp"
#include "relokv/layout/request_layout.hpp"
#include "relokv/memory/lru_block_pool.hpp"
#include "relokv/recompute/none.hpp"
#include "relokv/rope/at_attention.hpp"
#include "relokv/store/block_format.hpp"

RELOKV_NAMESPACE_BEGIN

/// Relocatable KV-cache manager. The library decides and manages memory; the engine computes.
///
/// Protocol for one request: plan (exact hit, relocated hit or miss per block; kOutOfBlocks
/// takes nothing), the engine computes what the plan masks, commit (the new blocks become
/// reusable), decode (extend), release (refcounts drop, blocks join the LRU queue).
/// engine/request_kv.hpp drives it for an engine loop; see README "Writing an engine loop".
///
/// Correctness does not rest on the hash: every hit compares the stored tokens and segment
/// structure of the block, and the identity of what precedes it (for an exact hit, the physical
/// parent block, checked by generation; for a relocated hit, the interned context tokens and
/// extra keys). A colliding hash can only turn a hit into a miss.
///
/// Threads: the cache is not internally synchronized. One thread (the engine's scheduler)
/// owns it and makes every call, const ones included; it keeps no global state, so caches on
/// different threads are independent. Kernels may run on other threads meanwhile: a block held
/// by a live request is never handed to another, so new blocks can be written while other
/// threads read live ones.
///
/// @tparam HashScheme        models hash_scheme (xxh3_128 by default)
/// @tparam BlockAllocator    models block_allocator (lru_block_pool by default)
/// @tparam RopePlacement     models rope_placement (at_attention by default)
/// @tparam RecomputeStrategy models recompute_strategy (recompute::none by default)
/// @tparam KvStore           models kv_store (no_store by default: no store tier at all)
///
/// With a store, pool misses are looked up there in one batched get and used only when they
/// verify as a pool hit does; commit(id, storage) puts the blocks a request computed from
/// nothing (detail/store_tier.hpp, docs/store.md). A store that is down makes lookups misses.
template <class HashScheme = xxh3_128, class BlockAllocator = lru_block_pool,
          class RopePlacement = at_attention, class RecomputeStrategy = recompute::none,
          class KvStore = no_store>
class relocatable_cache {
  static_assert(hash_scheme<HashScheme>,
                "HashScheme must model relokv::hash_scheme: a regular, trivially copyable "
                "key_type, digest(bytes, domain), combine(parent, child, domain) and a static "
                "bucket(key) -> size_t");
  static_assert(block_allocator<BlockAllocator>,
                "BlockAllocator must model relokv::block_allocator: allocate() -> alloc_result, "
                "retain, release, set_cached, capacity, num_free, ref_count, is_cached");
  static_assert(rope_placement<RopePlacement>,
                "RopePlacement must model relokv::rope_placement: kind, "
                "relocation_rotates_keys and stored_position(pos, slot)");
  static_assert(recompute_strategy<RecomputeStrategy>,
                "RecomputeStrategy must model relokv::recompute_strategy: "
                "select(layout, status, mask) and dynamic()");
  static_assert(kv_store<KvStore>,
                "KvStore must model relokv::kv_store: get(keys, blobs), put(keys, values), "
                "contains(keys, flags), erase(keys) -> store_status, and counters()");
  static constexpr bool kHasStore = !std::is_same_v<KvStore, no_store>;

 public:
  using hash_type = HashScheme;
  using key_type = typename HashScheme::key_type;
  using allocator_type = BlockAllocator;
  using placement_type = RopePlacement;
  using strategy_type = RecomputeStrategy;
  using store_type = KvStore;

  /// @param allocator   the block pool; its block ids index the engine's KV storage
  /// @param block_size  tokens per block (a power of two up to kMaxBlockSize; requests must
  ///                    use the same)
  relocatable_cache(BlockAllocator allocator, std::int32_t block_size,
                    HashScheme hash = HashScheme(),
                    RecomputeStrategy strategy = RecomputeStrategy())
      : alloc_(std::move(allocator)),
        hash_(std::move(hash)),
        strategy_(std::move(strategy)),
        block_size_(block_size),
        tier_() {
    init_pool();
    // Without store_options, a cache never touches its store.
    tier_.opts.read = tier_.opts.write = false;
  }

  /// A cache with a store tier (see the class comment).
  /// @throws error as above, and when `so.layout` is not a valid layout for `block_size`
  relocatable_cache(BlockAllocator allocator, std::int32_t block_size, HashScheme hash,
                    RecomputeStrategy strategy, KvStore store, store_options so)
      : alloc_(std::move(allocator)),
        hash_(std::move(hash)),
        strategy_(std::move(strategy)),
        block_size_(block_size),
        tier_(std::move(store), so) {
    init_pool();
    const kv_block_layout& l = so.layout;
    if (l.block_size != block_size || l.num_layers <= 0 || l.num_kv_heads <= 0 || l.head_dim <= 0 ||
        l.head_dim > kMaxHeadDim || l.elem_bytes == 0)
      throw error(
          "relocatable_cache: store_options.layout must have positive layers, heads "
          "and element size, head_dim in [1, " +
          std::to_string(kMaxHeadDim) + "] and the cache's block_size " +
          std::to_string(block_size) + " (got " + std::to_string(l.block_size) + ")");
  }

  /// Plans a request with the cache's strategy. See plan(layout, strategy, extras, principal).
  [[nodiscard]] reuse_plan plan(const request_layout& layout, const extra_keys& extras = {},
                                std::uint64_t principal = 0) {
    return plan(layout, strategy_, extras, principal);
  }

  /// Looks up every block (context key first, then content key), lets `strategy` choose the
  /// reused tokens to recompute, and takes the blocks the request needs: hits are shared,
  /// misses and copies on write are allocated. When the pool cannot supply the blocks the plan
  /// has status kOutOfBlocks and nothing was taken or evicted; such a plan carries the id
  /// kNoRequest, which commit() and release() reject with an error (they can never end
  /// another request), and its counters are zero.
  ///
  /// `principal` names who submits the request (a user, an API key), for the provenance
  /// policy: a relocated hit whose K/V another principal computed after other text is not
  /// served under the default policy (see provenance_policy). Requests of one principal
  /// (the default 0, for an engine that serves one user) share everything.
  /// @throws error if layout.block_size differs from the cache's; layout_error (rule
  ///         kMalformedLayout, naming the field) if the layout breaks an invariant of
  ///         check_layout, as only a hand-built one can. Nothing changes in either case.
  [[nodiscard]] reuse_plan plan(const request_layout& layout, const RecomputeStrategy& strategy,
                                const extra_keys& extras = {}, std::uint64_t principal = 0) {
    reuse_plan p;
    plan_into(layout, strategy, extras, p, principal);
    return p;
  }

  /// As plan(), into an existing reuse_plan whose buffers are reused (no allocation in steady
  /// state). Whatever `p` held before is overwritten, its id first: a plan that fails (by
  /// exception or kOutOfBlocks) never keeps an earlier request's id.
  void plan_into(const request_layout& layout, const RecomputeStrategy& strategy,
                 const extra_keys& extras, reuse_plan& p, std::uint64_t principal = 0) {
    p.id = kNoRequest;
    p.exact_hits = p.relocated_hits = p.misses = p.tokens_to_compute = p.store_hits = 0;
    p.fetches.clear();
    if (layout.block_size != block_size_)
      throw error("plan: layout block_size " + std::to_string(layout.block_size) +
                  " differs from the cache's " + std::to_string(block_size_));
    check_layout(layout);
    const std::int32_t nb = layout.num_blocks();
    derive_block_keys(hash_, layout, extras, keys_);
    request_state& rs = new_state();
    rs.extras = extras;
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

  /// Registers the request's new, sealed blocks under their keys so that later requests reuse
  /// them. Call once the engine has written them. A cache that writes to a store needs the
  /// storage to serialize them from: see commit(id, storage).
  /// @throws error for an unknown, released or already committed request, for kNoRequest (the
  ///         id of a failed plan), and when the cache has a store to write to.
  void commit(request_id id) {
    if (kHasStore && tier_.opts.write)
      throw error(
          "commit: this cache writes new blocks to its store; call commit(id, storage) "
          "with the KV storage, or set store_options.write = false");
    commit_impl(id, static_cast<const no_block_io*>(nullptr));
  }
  /// As commit(id), and puts the blocks the request computed from nothing into the store
  /// (when it has one and store_options.write is set), serialized from `storage` in one
  /// batched put. A put that fails is counted (stats().store_write_failures), never thrown:
  /// the blocks stay in the pool either way.
  /// @throws error as commit(id), and when storage's layout differs from store_options.layout
  template <class Storage>
  requires kv_block_io<Storage>
  void commit(request_id id, const Storage& storage) {
    if (kHasStore && tier_.opts.write && !(storage.block_layout() == tier_.opts.layout))
      throw error("commit: the storage's block layout differs from store_options.layout");
    commit_impl(id, &storage);
  }

 private:
  /// Stands for "no storage" in commit(id).
  struct no_block_io {
    [[nodiscard]] kv_block_layout block_layout() const noexcept { return {}; }
    void read_block(block_id, std::int32_t, std::span<std::byte>) const noexcept {}
    void write_block(block_id, std::int32_t, std::span<const std::byte>) noexcept {}
  };
  template <class Storage>
  void commit_impl(request_id id, const Storage* storage) {
    request_state& rs = state_of(id, "commit");
    if (rs.committed) throw error("commit: request " + std::to_string(id) + " already committed");
    rs.committed = true;
    // Context entries may have died since plan() and their slots been reused for another
    // context: re-derive them (by tokens and extra keys, never by slot) before linking.
    for (std::size_t s = 0; s < rs.segments.size(); ++s)
      rs.segment_entry[s] = detail::relocatable(rs.segments[s])
                                ? contexts_.find(rs, static_cast<std::int32_t>(s))
                                : -1;
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

 public:
  /// Gives a live request one more block (for decode, once its last block is full). The block
  /// is private to the request and never registered; release() frees it.
  /// @return the block, or status kOutOfBlocks (nothing taken) for the scheduler to act on
  [[nodiscard]] alloc_result extend(request_id id) {
    request_state& rs = state_of(id, "extend");
    const alloc_result r = alloc_.allocate();
    if (r.status != alloc_status::kOk) {
      ++stats_.out_of_blocks;
      return r;
    }
    forget(r.block);
    stats_.evictions += r.evicted ? 1 : 0;
    ++meta_[static_cast<std::size_t>(r.block)].generation;
    rs.held.push_back(r.block);
    return r;
  }

  /// Ends a request: its references drop, tail blocks first, so that the tail of a finished
  /// request is evicted before its head.
  /// @throws error for an unknown or already released request, and for kNoRequest (the id of
  ///         a failed plan: it holds nothing).
  void release(request_id id) {
    request_state& rs = state_of(id, "release");
    for (auto it = rs.held.rbegin(); it != rs.held.rend(); ++it) alloc_.release(*it);
    rs.held.clear();
    rs.live = false;
    free_states_.push_back(live_.at(id));
    live_.erase(id);
  }

  [[nodiscard]] const cache_stats& stats() const noexcept { return stats_; }
  /// Which relocated hits the cache serves (default kCanonicalOrSamePrincipal). Applies to
  /// plans made after the call, pool and store alike; exact-context hits are never affected.
  void set_provenance_policy(provenance_policy policy) noexcept { provenance_ = policy; }
  [[nodiscard]] provenance_policy provenance() const noexcept { return provenance_; }
  /// How a cached block's K/V were computed (valid for cached blocks).
  [[nodiscard]] block_origin origin_of(block_id b) const noexcept { return meta_of(b).origin; }
  [[nodiscard]] const BlockAllocator& allocator() const noexcept { return alloc_; }
  [[nodiscard]] const HashScheme& hash() const noexcept { return hash_; }
  [[nodiscard]] const RecomputeStrategy& strategy() const noexcept { return strategy_; }
  [[nodiscard]] KvStore& store() noexcept { return tier_.store; }
  [[nodiscard]] const KvStore& store() const noexcept { return tier_.store; }
  [[nodiscard]] const store_options& store_config() const noexcept { return tier_.opts; }
  [[nodiscard]] std::int32_t block_size() const noexcept { return block_size_; }
  /// Requests planned and not yet released.
  [[nodiscard]] std::size_t live_requests() const noexcept { return live_.size(); }
  /// Blocks whose contents are indexed (in use or free-but-cached).
  [[nodiscard]] std::int32_t cached_blocks() const noexcept {
    std::int32_t n = 0;
    for (const block_meta& m : meta_) n += (m.in_ctx || m.in_content) ? 1 : 0;
    return n;
  }
  /// The tokens a cached block holds (valid for cached blocks).
  [[nodiscard]] std::span<const token_t> tokens_of(block_id b) const noexcept {
    return {tokens_.data() + static_cast<std::size_t>(b) * static_cast<std::size_t>(block_size_),
            static_cast<std::size_t>(meta_of(b).len)};
  }

 private:
  struct key_hasher {
    std::size_t operator()(const key_type& k) const noexcept { return HashScheme::bucket(k); }
  };
  using index_t = std::unordered_map<key_type, block_id, key_hasher>;

  using block_meta = detail::block_meta<key_type>;
  using request_state = detail::request_state<key_type>;

  static constexpr bool needs_rotation_v = RopePlacement::relocation_rotates_keys;
  /// src_pos0: the position the hit's keys were written at (pool or store).
  static bool needs_rotation(const planned_block& pb, pos_t src_pos0) noexcept {
    if constexpr (needs_rotation_v) {
      return pb.status == block_status::kRelocatedHit && src_pos0 != pb.pos0;
    } else {
      (void)pb;
      (void)src_pos0;
      return false;
    }
  }
  void init_pool() {
    const std::int32_t block_size = block_size_;
    if (block_size <= 0 || block_size > kMaxBlockSize || (block_size & (block_size - 1)) != 0)
      throw error("relocatable_cache: block_size must be a power of two in [1, " +
                  std::to_string(kMaxBlockSize) + "], got " + std::to_string(block_size));
    const auto n = static_cast<std::size_t>(alloc_.capacity());
    if (n > (std::size_t{1} << 31) / static_cast<std::size_t>(block_size))
      throw error("relocatable_cache: " + std::to_string(n) + " blocks of " +
                  std::to_string(block_size) + " tokens exceed 2^31 stored tokens");
    meta_.resize(n);
    tokens_.resize(n * static_cast<std::size_t>(block_size));
  }
  /// The position a hit's keys were written at: the fetched entry's, or the pool block's.
  pos_t src_pos0_of(const request_state& rs, std::size_t bi, const planned_block& pb) const {
    if constexpr (kHasStore) {
      if (pb.tier == block_tier::kStore) return rs.src_pos0[bi];
    }
    (void)rs;
    (void)bi;
    return pb.source == kNoBlock ? 0 : meta_of(pb.source).stored_pos0;
  }
  /// Whether the K/V of each block of a committed request are canonical (block_origin): a
  /// block the request computed is when its segment starts right after its own context (or
  /// its key binds everything before it) and the blocks before it in the segment are; a reused
  /// block keeps its source's origin (a private copy the request recomputed tokens of, only
  /// at a canonical position).
  void mark_canonical(request_state& rs) const {
    for (std::size_t bi = 0; bi < rs.blocks.size(); ++bi) {
      const planned_block& pb = rs.plan_blocks[bi];
      const block_extent& e = rs.blocks[bi];
      const segment& seg = rs.segments[static_cast<std::size_t>(e.segment)];
      const auto b = static_cast<std::int32_t>(bi);
      // In place: the segment starts right after its own context, and (for a span_context)
      // that context is what actually precedes it.
      const auto ctx = detail::context_tokens(rs, e.segment);
      const bool in_place =
          !detail::relocatable(seg) || (static_cast<std::int32_t>(ctx.size()) == seg.first_token &&
                                        (!rs.has_span_context || seg.kind != segment_kind::kSpan ||
                                         std::equal(ctx.begin(), ctx.end(), rs.tokens.begin())) &&
                                        (b == seg.first_block || rs.canonical[bi - 1] != 0));
      bool c = in_place;
      if (!pb.fresh) {
        const bool source = pb.tier == block_tier::kStore ? rs.fetched_origin[bi].canonical
                            : pb.source == kNoBlock       ? false
                                                          : meta_of(pb.source).origin.canonical;
        c = source && (!pb.copy_on_write || in_place);
      }
      rs.canonical[bi] = c ? 1 : 0;
    }
  }
  /// The origin a block registered by a committed request records.
  block_origin origin_of(const request_state& rs, std::size_t bi) const {
    const planned_block& pb = rs.plan_blocks[bi];
    if constexpr (kHasStore) {
      if (!pb.fresh && pb.tier == block_tier::kStore) return rs.fetched_origin[bi];
    }
    return {rs.canonical[bi] != 0, rs.principal};
  }
  /// A block for the request: allocated (the plan counted it free), its old keys forgotten.
  block_id take_block(request_state& rs) {
    const alloc_result r = alloc_.allocate();
    RELOKV_ASSERT(r.status == alloc_status::kOk, "pool had fewer free blocks than counted");
    forget(r.block);
    stats_.evictions += r.evicted ? 1 : 0;
    ++meta_[static_cast<std::size_t>(r.block)].generation;
    rs.held.push_back(r.block);
    return r.block;
  }

  block_meta& meta_of(block_id b) noexcept { return meta_[static_cast<std::size_t>(b)]; }
  const block_meta& meta_of(block_id b) const noexcept {
    return meta_[static_cast<std::size_t>(b)];
  }
  token_t* block_tokens(block_id b) noexcept {
    return tokens_.data() + static_cast<std::size_t>(b) * static_cast<std::size_t>(block_size_);
  }

  static block_id lookup(const index_t& idx, const key_type& k) {
    const auto it = idx.find(k);
    return it == idx.end() ? kNoBlock : it->second;
  }

  bool same_block(const request_state& rs, std::int32_t b, block_id q) const noexcept {
    const block_extent& e = rs.blocks[static_cast<std::size_t>(b)];
    const segment& seg = rs.segments[static_cast<std::size_t>(e.segment)];
    const block_meta& m = meta_of(q);
    if (m.len != e.len || m.tag != block_tag(seg, b == seg.first_block)) return false;
    return std::equal(rs.tokens.begin() + e.pos0, rs.tokens.begin() + e.pos0 + e.len,
                      tokens_.begin() + static_cast<std::ptrdiff_t>(q) * block_size_);
  }
  /// True when cached block q holds request block b with the same context (exact) or the
  /// same span content and span context (content). Walks q's parent links, comparing tokens,
  /// until it meets a block the request already resolved or the start of the chain; links are
  /// checked by generation, so an evicted and reused parent never matches.
  bool verify_chain(const request_state& rs, std::int32_t b, block_id q, bool exact) const {
    const block_meta& head = meta_of(q);
    if (exact ? !head.in_ctx : !head.in_content) return false;
    const std::int32_t seg_index = rs.blocks[static_cast<std::size_t>(b)].segment;
    const std::int32_t start =
        exact ? 0 : rs.segments[static_cast<std::size_t>(seg_index)].first_block;
    block_id cur = q;
    for (std::int32_t i = b;; --i) {
      const block_meta& m = meta_of(cur);
      if (!same_block(rs, i, cur)) return false;
      const block_id parent = exact ? m.ctx_parent : m.content_parent;
      if (i == start) {
        if (parent != kNoBlock) return false;
        if (exact) return m.extras == rs.extras;
        const std::int32_t entry = rs.segment_entry[static_cast<std::size_t>(seg_index)];
        return entry >= 0 && m.context_entry == entry;
      }
      if (parent == kNoBlock ||
          meta_of(parent).generation != (exact ? m.ctx_parent_gen : m.content_parent_gen))
        return false;
      if (parent == rs.ident[static_cast<std::size_t>(i - 1)]) return true;  // resolved already
      cur = parent;
    }
  }

  /// A block is handed out again: forget its keys and links (it may never have had any).
  void forget(block_id b) {
    block_meta& m = meta_of(b);
    if (m.in_ctx) {
      const auto it = ctx_index_.find(m.ctx_key);
      if (it != ctx_index_.end() && it->second == b) ctx_index_.erase(it);
    }
    if (m.in_content) {
      const auto it = content_index_.find(m.content_key);
      if (it != content_index_.end() && it->second == b) content_index_.erase(it);
    }
    if (m.context_entry >= 0) contexts_.release(m.context_entry);
    const std::uint32_t gen = m.generation;
    m = block_meta{};
    m.generation = gen;
  }

  // Counting distinct hit blocks that are free right now (a block may be hit twice).
  bool counted_free(block_id b) {
    if (counted_.size() < meta_.size()) counted_.resize(meta_.size(), 0);
    const bool seen = counted_[static_cast<std::size_t>(b)] != 0;
    counted_[static_cast<std::size_t>(b)] = 1;
    return seen;
  }
  void clear_counted(const reuse_plan& p) {
    for (const planned_block& pb : p.blocks)
      if (pb.physical != kNoBlock && pb.status != block_status::kMiss && !counted_.empty())
        counted_[static_cast<std::size_t>(pb.physical)] = 0;
  }

  request_state& new_state() {
    if (!free_states_.empty()) {
      rs_index_ = free_states_.back();
      free_states_.pop_back();
    } else {
      rs_index_ = states_.size();
      states_.emplace_back();
    }
    request_state& rs = states_[rs_index_];
    rs.live = false;
    rs.committed = false;
    return rs;
  }
  request_state& state_of(request_id id, const char* what) {
    const auto it = live_.find(id);
    if (it == live_.end())
      throw error(std::string(what) + ": unknown or released request " + std::to_string(id));
    return states_[it->second];
  }

  BlockAllocator alloc_;
  HashScheme hash_;
  RecomputeStrategy strategy_;
  std::int32_t block_size_;
  std::vector<block_meta> meta_;
  std::vector<token_t> tokens_;  // [block][block_size]
  index_t ctx_index_;
  index_t content_index_;
  detail::context_table<key_type, key_hasher> contexts_;
  std::vector<request_state> states_;  // reused, so that steady-state planning does not allocate
  std::vector<std::size_t> free_states_;
  std::size_t rs_index_ = 0;
  std::unordered_map<request_id, std::size_t> live_;
  request_id next_id_ = 1;
  block_keys<HashScheme> keys_;
  std::vector<block_status> status_;
  std::vector<std::uint8_t> counted_;
  cache_stats stats_;
  provenance_policy provenance_ = provenance_policy::kCanonicalOrSamePrincipal;
  detail::store_tier<KvStore> tier_;  ///< empty without a store
};

RELOKV_NAMESPACE_END
