#pragma once
/// @file
/// relocatable_cache's store tier: its store and options, the lookup of a plan's pool misses
/// in one batched get (each fetched entry verified before it becomes a hit), and the batched
/// put of the blocks a committed request computed. Empty, and never called, with no_store.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "relokv/block_table.hpp"
#include "relokv/cache/cache_stats.hpp"
#include "relokv/cache/detail/cache_state.hpp"
#include "relokv/cache/reuse_plan.hpp"
#include "relokv/concepts/kv_store.hpp"
#include "relokv/concepts/recompute_strategy.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/layout/request_layout.hpp"
#include "relokv/store/block_format.hpp"

RELOKV_NAMESPACE_BEGIN
namespace detail {

static_assert(sizeof(cache_stats::store_rejected) / sizeof(std::int64_t) == kBlockCheckCount,
              "cache_stats::store_rejected has one counter per block_check");

template <class KvStore>
class store_tier {
 public:
  store_tier() = default;
  /// Tells a store that can bound what it reads (limit_value_bytes) the largest entry this
  /// layout encodes to (sealed_store adds its tag): one reply or file past it is refused
  /// before its bytes are held, so a batched get of n keys holds at most n such entries.
  store_tier(KvStore s, store_options o) : store(std::move(s)), opts(o) {
    if constexpr (requires(KvStore & k, std::size_t n) { k.limit_value_bytes(n); }) {
      if (opts.layout.block_size > 0) store.limit_value_bytes(max_encoded_block_bytes(opts.layout));
    }
  }

  KvStore store;
  store_options opts{};
  /// Per block of the plan being made: the verified fetch, if any (moved into plan.fetches).
  std::vector<block_fetch> fetched;

  /// Which key a block is stored under: content for a span's (or windowed dependent
  /// segment's) blocks, context for the others. One copy per block: a span's context entry
  /// would duplicate its bytes for the rare request that shows it in the same place.
  static store_entry_kind kind_of(std::span<const segment> segments,
                                  const block_extent& e) noexcept {
    return relocatable(segments[static_cast<std::size_t>(e.segment)]) ? store_entry_kind::kContent
                                                                      : store_entry_kind::kContext;
  }
  template <class Key>
  static store_entry_kind store_kind(const request_state<Key>& rs, std::size_t bi) noexcept {
    return kind_of(rs.segments, rs.blocks[bi]);
  }
  /// The name of a block's entry of `kind`, from its content and context keys.
  template <class Key>
  store_key key_of(store_entry_kind kind, const extra_keys& x, const Key& content,
                   const Key& context, std::int32_t block_size) const {
    return make_store_key(opts.fingerprint, kind, block_size, x,
                          kind == store_entry_kind::kContent ? content : context);
  }
  template <class Key>
  store_key store_key_of(const request_state<Key>& rs, std::size_t bi, store_entry_kind kind,
                         std::int32_t block_size) const {
    return key_of(kind, rs.extras, rs.content_key[bi], rs.context_key[bi], block_size);
  }
  /// What a stored block is verified by (block_format.hpp): its tag and tokens, and the
  /// SHA-256 of what precedes it (every block from the request's start for a context entry;
  /// the span's context tokens and its blocks before this one for a content entry).
  template <class Key>
  block_identity identity_of(request_state<Key>& rs, std::size_t bi) {
    if (!rs.id_ready) digest_identities(rs);
    const block_extent& e = rs.blocks[bi];
    const segment& seg = rs.segments[static_cast<std::size_t>(e.segment)];
    return {rs.id_before[bi], block_tag(seg, static_cast<std::int32_t>(bi) == seg.first_block),
            std::span<const token_t>(rs.tokens).subspan(static_cast<std::size_t>(e.pos0),
                                                        static_cast<std::size_t>(e.len))};
  }

  /// The blocks of a plan's pool misses (`status`, `compute` as step 1 left them) worth a
  /// store lookup, into `out`: sealed misses, less those a static strategy would recompute
  /// whole even as hits (EPIC's first k of a span, when k covers the block), which go to
  /// `kept_out` when given. `spec_status` and `spec_mask` are scratch.
  template <class Strategy>
  static void fetch_candidates(const request_layout& layout, const Strategy& strategy,
                               std::span<const block_status> status,
                               std::span<const std::uint8_t> compute,
                               std::vector<block_status>& spec_status,
                               std::vector<std::uint8_t>& spec_mask, std::vector<std::size_t>& out,
                               std::vector<std::uint8_t>* kept_out) {
    out.clear();
    const auto nb = static_cast<std::size_t>(layout.num_blocks());
    const auto candidate = [&](std::size_t b) {
      return status[b] == block_status::kMiss && layout.blocks[b].sealed;
    };
    // What the strategy would recompute if every candidate were found.
    const bool speculate = !narrows_mask(strategy);
    if (speculate) {
      spec_status.assign(status.begin(), status.end());
      spec_mask.assign(compute.begin(), compute.end());
      for (std::size_t b = 0; b < nb; ++b)
        if (candidate(b)) {
          spec_status[b] = kind_of(layout.segments, layout.blocks[b]) == store_entry_kind::kContent
                               ? block_status::kRelocatedHit
                               : block_status::kExactHit;
          const block_extent& e = layout.blocks[b];
          std::fill_n(spec_mask.begin() + e.pos0, e.len, std::uint8_t{0});
        }
      strategy.select(layout, std::span<const block_status>(spec_status), std::span(spec_mask));
    }
    for (std::size_t b = 0; b < nb; ++b) {
      if (!candidate(b)) continue;
      const block_extent& e = layout.blocks[b];
      if (speculate && count_ones(spec_mask.data() + e.pos0, e.len) == e.len) {
        if (kept_out)
          (*kept_out)[b] = 1;  // the store may hold it; this request's recompute is not for it
        continue;
      }
      out.push_back(b);
    }
  }

  /// Looks the pool's misses up in the store, in one batched get; a verified entry becomes a
  /// hit of tier kStore (its block is taken in step 4). What is looked up: fetch_candidates.
  template <class Key, class Strategy>
  void fetch(const request_layout& layout, const Strategy& strategy, request_state<Key>& rs,
             reuse_plan& p, std::vector<block_status>& status_, cache_stats& stats_,
             std::int32_t block_size, placement_kind placement, provenance_policy provenance) {
    const auto nb = static_cast<std::size_t>(layout.num_blocks());
    fetched.assign(nb, block_fetch{});
    fetch_candidates(layout, strategy, std::span<const block_status>(status_),
                     std::span<const std::uint8_t>(p.compute), spec_status_, spec_mask_,
                     fetch_blocks_, &rs.keep_out);
    fetch_keys_.clear();
    for (const std::size_t b : fetch_blocks_)
      fetch_keys_.push_back(store_key_of(rs, b, store_kind(rs, b), block_size));
    if (fetch_keys_.empty()) return;
    stats_.store_lookups += static_cast<std::int64_t>(fetch_keys_.size());
    if (store.get(std::span<const store_key>(fetch_keys_), blobs_) != store_status::kOk ||
        blobs_.size() != fetch_keys_.size()) {
      ++stats_.store_unavailable;
      return;
    }
    for (std::size_t i = 0; i < fetch_blocks_.size(); ++i) {
      const std::size_t b = fetch_blocks_[i];
      const store_blob& blob = blobs_[i];
      if (blob.empty()) {
        ++stats_.store_misses;
        continue;
      }
      stats_.store_bytes_read += static_cast<std::int64_t>(blob.size());
      const store_entry_kind kind = store_kind(rs, b);
      decoded_block d = decode_block(blob.bytes(), opts.fingerprint, opts.layout);
      if (d.check == block_check::kOk && d.header.placement != placement)
        d.check = block_check::kFingerprint;
      if (d.check == block_check::kOk &&
          !same_identity(d, fetch_keys_[i], kind, rs.extras, identity_of(rs, b)))
        d.check = block_check::kIdentity;
      if (d.check == block_check::kOk && kind == store_entry_kind::kContent &&
          !serves(provenance, d.header.origin, rs.principal))
        d.check = block_check::kProvenance;
      if (d.check != block_check::kOk) {
        ++stats_.store_rejected[static_cast<std::size_t>(d.check)];
        continue;
      }
      const block_extent& e = layout.blocks[b];
      status_[b] = kind == store_entry_kind::kContext ? block_status::kExactHit
                                                      : block_status::kRelocatedHit;
      planned_block& pb = p.blocks[b];
      pb.status = status_[b];
      pb.tier = block_tier::kStore;
      rs.src_pos0[b] = d.header.pos0;
      rs.fetched_origin[b] = d.header.origin;
      std::fill_n(p.compute.begin() + e.pos0, e.len, std::uint8_t{0});
      fetched[b] = block_fetch{kNoBlock, e.len, static_cast<std::int32_t>(b), blob, d.payload};
    }
  }

  /// Puts the blocks a committed request computed from nothing, in one batched put.
  template <class Key, class Storage>
  void write(request_state<Key>& rs, const Storage& storage, cache_stats& stats_,
             std::int32_t block_size, placement_kind placement) {
    write_keys_.clear();
    std::size_t n = 0;
    for (std::size_t bi = 0; bi < rs.blocks.size(); ++bi) {
      const planned_block& pb = rs.plan_blocks[bi];
      const block_extent& e = rs.blocks[bi];
      if (!e.sealed || !pb.fresh || pb.status != block_status::kMiss || rs.keep_out[bi]) continue;
      const store_entry_kind kind = store_kind(rs, bi);
      if (kind == store_entry_kind::kContext && !rs.exact[bi]) continue;
      block_header h;
      h.fingerprint = opts.fingerprint;
      h.key = store_key_of(rs, bi, kind, block_size);
      h.layout = opts.layout;
      h.kind = kind;
      h.placement = placement;
      h.len = e.len;
      h.pos0 = e.pos0;
      h.extras = rs.extras;
      h.origin = {rs.canonical[bi] != 0, rs.principal};
      if (write_bufs_.size() <= n) write_bufs_.emplace_back();
      const block_id src = pb.physical;
      const std::int32_t len = e.len;
      encode_block(
          h, identity_of(rs, bi),
          [&storage, src, len](std::span<std::byte> out) { storage.read_block(src, len, out); },
          write_bufs_[n]);
      write_keys_.push_back(h.key);
      ++n;
    }
    if (n == 0) return;
    write_views_.clear();
    for (std::size_t i = 0; i < n; ++i)
      write_views_.emplace_back(write_bufs_[i].data(), write_bufs_[i].size());
    // Accepted: all of them when the put says so (a write-behind store has queued them),
    // else as many as the store counted written.
    const std::int64_t before = store.counters().keys_written;
    const store_status st = store.put(std::span<const store_key>(write_keys_),
                                      std::span<const std::span<const std::byte>>(write_views_));
    const std::int64_t written =
        st == store_status::kOk ? static_cast<std::int64_t>(n)
                                : std::clamp<std::int64_t>(store.counters().keys_written - before,
                                                           0, static_cast<std::int64_t>(n));
    stats_.store_writes += written;
    stats_.store_write_failures += static_cast<std::int64_t>(n) - written;
    for (std::size_t i = 0; i < n; ++i)
      stats_.store_bytes_written += static_cast<std::int64_t>(write_bufs_[i].size());
  }

 private:
  /// Every block's identity digest in one pass over the request: a running chain from the
  /// start (context entries) and one per relocatable segment, seeded with its context.
  template <class Key>
  void digest_identities(request_state<Key>& rs) {
    rs.id_before.resize(rs.blocks.size());
    all_.begin_context();
    for (std::size_t bi = 0; bi < rs.blocks.size(); ++bi) {
      const block_extent& e = rs.blocks[bi];
      const segment& seg = rs.segments[static_cast<std::size_t>(e.segment)];
      const bool first = static_cast<std::int32_t>(bi) == seg.first_block;
      const bool content = relocatable(seg);
      if (content && first) span_.begin_content(context_tokens(rs, e.segment));
      rs.id_before[bi] = content ? span_.digest() : all_.digest();
      const std::uint32_t tag = block_tag(seg, first);
      const auto toks = std::span<const token_t>(rs.tokens).subspan(
          static_cast<std::size_t>(e.pos0), static_cast<std::size_t>(e.len));
      all_.absorb(tag, toks);
      if (content) span_.absorb(tag, toks);
    }
    rs.id_ready = true;
  }

  identity_chain all_, span_;
  std::vector<store_key> fetch_keys_, write_keys_;
  std::vector<std::size_t> fetch_blocks_;
  std::vector<store_blob> blobs_;
  std::vector<block_status> spec_status_;
  std::vector<std::uint8_t> spec_mask_;
  std::vector<std::vector<std::byte>> write_bufs_;
  std::vector<std::span<const std::byte>> write_views_;
};

}  // namespace detail
RELOKV_NAMESPACE_END
