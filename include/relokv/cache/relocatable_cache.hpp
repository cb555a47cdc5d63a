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
/// engine/request_kv.hpp drives it for an engine loop; see docs/integrating.md, "Writing an engine
/// loop".
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
                 const extra_keys& extras, reuse_plan& p, std::uint64_t principal = 0);

  /// The store entries a plan of `layout` would look up if it were made now, into `out`: those
  /// of its sealed blocks the pool does not hold, less those `strategy` would recompute whole
  /// even as hits. For a prefetch on another thread (store/prefetching_store.hpp) while the
  /// request waits, so that its plan finds them staged and never waits for the store. Changes
  /// nothing: no request, no LRU order, no counter. A pool entry is taken as held without its
  /// chain verified (the plan verifies; at worst a block is not prefetched and is computed), and
  /// the pool may change before the plan. Empty without a store, or when reads are off.
  /// @throws as plan() for a layout plan() would refuse
  void store_keys(const request_layout& layout, const RecomputeStrategy& strategy,
                  const extra_keys& extras, std::vector<store_key>& out,
                  std::uint64_t principal = 0) const;

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
  void commit_impl(request_id id, const Storage* storage);

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
  /// its key binds everything before it), every block before it in the request (all of which
  /// its K/V attended to) is canonical, and so are the blocks before it in the segment; a
  /// reused block keeps its source's origin (a private copy the request recomputed tokens of,
  /// only at a canonical position). Transitive: K/V computed over a relocated or poisoned
  /// block are not canonical, whatever their tokens (a dependent window over a reused span,
  /// a span behind a span_context whose leading tokens were reused).
  void mark_canonical(request_state& rs) const;
  /// The origin a block registered by a committed request records.
  block_origin origin_of(const request_state& rs, std::size_t bi) const {
    const planned_block& pb = rs.plan_blocks[bi];
    if constexpr (kHasStore) {
      if (!pb.fresh && pb.tier == block_tier::kStore) return rs.fetched_origin[bi];
    }
    return {rs.canonical[bi] != 0, rs.principal};
  }
  /// What plan() and store_keys() refuse: another block size, a malformed layout.
  void check_request(const request_layout& layout, const char* what) const {
    if (layout.block_size != block_size_)
      throw error(std::string(what) + ": layout block_size " + std::to_string(layout.block_size) +
                  " differs from the cache's " + std::to_string(block_size_));
    check_layout(layout);
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

// Out of line, by role: planning, and commit with its provenance marking.
#include "relokv/cache/detail/cache_commit.hpp"  // IWYU pragma: export
#include "relokv/cache/detail/cache_plan.hpp"    // IWYU pragma: export
