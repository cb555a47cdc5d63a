#pragma once
/// @file
/// The vocabulary a reuse plan shares with the kernels and the strategies: what the lookup
/// found for a block, the block table attention reads, and the copies an engine performs.
/// Below every folder (see docs/architecture.md): the cache produces these, the rest read them.
#include <cstdint>

#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// Outcome of the lookup for one block.
enum class block_status : std::uint8_t {
  kMiss,          ///< not cached: computed by this request
  kExactHit,      ///< context key hit: same tokens, same everything before; nothing to recompute
  kRelocatedHit,  ///< content key hit: same span in the same context, now at another position
};

/// How a cached block's K/V were computed (its provenance), kept in the pool and the store.
struct block_origin {
  /// Computed right after its own context (a span after its prefix, a dependent segment after
  /// its window) and after blocks that were canonical too: no other request text shaped it.
  bool canonical = false;
  std::uint64_t principal = 0;  ///< who computed it: the principal of the request
  friend bool operator==(const block_origin&, const block_origin&) = default;
};

/// Which relocated hits a cache serves, by the provenance of their K/V. A span's K/V computed
/// after some other text carry that text into every prompt that reuses them at another
/// position (HijackKV, arXiv 2607.19957); exact-context hits are never affected.
enum class provenance_policy : std::uint8_t {
  /// A relocated hit only from a canonical compilation or from a block computed by the
  /// request's own principal (the default).
  kCanonicalOrSamePrincipal,
  kPermissive,  ///< every relocated hit that verifies, whoever computed it and after what
};

/// Whether `policy` serves a relocated hit of `origin` to a request of `principal`.
[[nodiscard]] constexpr bool serves(provenance_policy policy, const block_origin& origin,
                                    std::uint64_t principal) noexcept {
  return policy == provenance_policy::kPermissive || origin.canonical ||
         origin.principal == principal;
}

/// One entry of a request's block table: what attention reads.
struct block_entry {
  block_id block = kNoBlock;
  pos_t pos0 = 0;        ///< logical position of slot 0 in this request
  std::int32_t len = 0;  ///< valid slots; the rest is padding, never attended
  friend bool operator==(const block_entry&, const block_entry&) = default;
};

/// A copy the engine performs before prefill: every layer of src into dst. When the RoPE
/// placement stores keys rotated at absolute positions (pre_rotated) and src_pos0 != dst_pos0,
/// the keys of the copy are rotated by dst_pos0 - src_pos0 (relocate_block, kv_append.hpp).
struct block_copy {
  block_id src = kNoBlock;
  block_id dst = kNoBlock;
  pos_t src_pos0 = 0;
  pos_t dst_pos0 = 0;
  [[nodiscard]] constexpr bool rotates() const noexcept { return src_pos0 != dst_pos0; }
};

RELOKV_NAMESPACE_END
