#pragma once
/// @file
/// What a relocatable_cache counts (cache_stats) and how it uses its store (store_options).
#include <cstdint>

#include "relokv/concepts/kv_store.hpp"

RELOKV_NAMESPACE_BEGIN

/// Running totals, for reports and tests.
struct cache_stats {
  std::int64_t requests = 0;
  std::int64_t blocks_looked_up = 0;
  std::int64_t exact_hits = 0;
  std::int64_t relocated_hits = 0;
  std::int64_t misses = 0;
  std::int64_t evictions = 0;
  std::int64_t out_of_blocks = 0;
  /// Relocated pool hits the provenance policy did not serve (computed instead).
  std::int64_t provenance_denied = 0;
  // The store tier (zero without a store).
  std::int64_t store_lookups = 0;      ///< pool misses looked up in the store
  std::int64_t store_hits = 0;         ///< verified fetches that became hits
  std::int64_t store_misses = 0;       ///< no entry under the key
  std::int64_t store_unavailable = 0;  ///< store calls that were not answered
  /// Entries fetched and rejected, indexed by their block_check (malformed, version,
  /// checksum, fingerprint, layout, identity, sealed, provenance; [0], kOk, stays 0).
  std::int64_t store_rejected[9] = {};
  std::int64_t store_writes = 0;          ///< blocks commit handed the store (queued, write-behind)
  std::int64_t store_write_failures = 0;  ///< blocks a put did not store
  std::int64_t store_bytes_read = 0, store_bytes_written = 0;
  [[nodiscard]] std::int64_t store_rejected_total() const noexcept {
    std::int64_t n = 0;
    for (std::int64_t r : store_rejected) n += r;
    return n;
  }
};

/// How a cache uses its store (relocatable_cache's fifth policy).
struct store_options {
  /// store_fingerprint(model, RoPE configuration, placement): blocks of another fingerprint
  /// are never used, and it is part of every store key.
  std::uint64_t fingerprint = 0;
  /// The engine's KV layout (its storage's block_layout()); fetched blocks must match it.
  kv_block_layout layout{};
  bool read = true;   ///< plan() looks pool misses up in the store
  bool write = true;  ///< commit() puts the blocks the request computed
};

RELOKV_NAMESPACE_END
