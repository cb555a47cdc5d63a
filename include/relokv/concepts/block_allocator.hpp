#pragma once
/// @file
/// The block-allocator policy axis.
#include <concepts>
#include <cstdint>

#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// Outcome of an allocation. Running out is a status, never an abort: a scheduler waits or
/// preempts and tries again.
enum class alloc_status : std::uint8_t { kOk, kOutOfBlocks };

struct alloc_result {
  alloc_status status = alloc_status::kOutOfBlocks;
  block_id block = kNoBlock;
  /// True when the block was free but still cached: its previous contents (and the keys that
  /// pointed at it) are gone, and the owner of the index must forget them.
  bool evicted = false;
};

/// A pool of fixed-size KV blocks with reference counts.
///
/// Requirements:
///  - `a.allocate()`: a block with reference count 1, taken first from the never-cached free
///    blocks, then by evicting the least recently used free-but-cached block;
///  - `a.retain(b)`: one more reference (a free-but-cached block leaves the eviction queue);
///  - `a.release(b)`: one reference fewer; at zero the block becomes free (evictable if cached);
///  - `a.set_cached(b, bool)`: whether b's contents are indexed (kept while free);
///  - queries `capacity()`, `num_free()` (allocatable now, evictions included), `ref_count(b)`,
///    `is_cached(b)`.
template <class A>
concept block_allocator = requires(A& a, const A& ca, block_id b, bool flag) {
  { a.allocate() } -> std::same_as<alloc_result>;
  { a.retain(b) } -> std::same_as<void>;
  { a.release(b) } -> std::same_as<void>;
  { a.set_cached(b, flag) } -> std::same_as<void>;
  { ca.capacity() } -> std::convertible_to<std::int32_t>;
  { ca.num_free() } -> std::convertible_to<std::int32_t>;
  { ca.ref_count(b) } -> std::convertible_to<std::int32_t>;
  { ca.is_cached(b) } -> std::convertible_to<bool>;
};

RELOKV_NAMESPACE_END
