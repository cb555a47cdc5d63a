#pragma once
/// @file
/// What relocatable_cache::plan decides for one request; what the engine's scheduler consumes.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "relokv/block_table.hpp"
#include "relokv/concepts/kv_store.hpp"
#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// Where a block's K and V come from in this request.
enum class block_tier : std::uint8_t {
  kComputed,  ///< the request computes every token (a miss, or a hit recomputed whole)
  kPool,      ///< a block of the pool, as it is or through a copy
  kStore,     ///< fetched from the store: the engine writes the fetched bytes (see fetches)
};

/// One block of a plan.
struct planned_block {
  block_id physical = kNoBlock;  ///< block this request reads and (if computing) writes
  /// For a hit: the cached block the lookup found (equal to `physical` when the request reads
  /// it as it is, the copy's source for copy_on_write). kNoBlock for a miss.
  block_id source = kNoBlock;
  pos_t pos0 = 0;
  std::int32_t len = 0;
  block_status status = block_status::kMiss;
  /// True when the request writes every slot of `physical` itself (a miss, or a hit whose every
  /// token the strategy recomputes); such blocks are registered by commit.
  bool fresh = true;
  /// True when `physical` is a private copy of a shared block (see reuse_plan::copies).
  bool copy_on_write = false;
  block_tier tier = block_tier::kComputed;
};

/// A block fetched from the store: the engine writes `payload` (slots [0, len) of every layer,
/// in kv_block_io's payload order) into block `dst` before it performs the copies, which may
/// read it (a fetched block that is relocated or partly recomputed is copied like a pool hit).
struct block_fetch {
  block_id dst = kNoBlock;
  std::int32_t len = 0;
  std::int32_t block_index = 0;  ///< in reuse_plan::blocks
  store_blob blob;               ///< keeps the fetched bytes alive
  std::span<const std::byte> payload;
};

enum class plan_status : std::uint8_t {
  kOk,
  kOutOfBlocks,  ///< not enough free blocks: nothing was taken; wait or preempt, then retry
};

/// The reuse plan of one request.
struct reuse_plan {
  plan_status status = plan_status::kOk;
  request_id id = 0;
  std::int32_t blocks_short = 0;  ///< kOutOfBlocks: how many more free blocks were needed
  std::vector<planned_block> blocks;
  /// Per token (indexed by logical position): 1 if the engine computes it in this request.
  std::vector<std::uint8_t> compute;
  std::vector<block_copy> copies;
  /// Blocks fetched from the store, written by the engine first (apply_fetches).
  std::vector<block_fetch> fetches;
  std::int32_t exact_hits = 0;
  std::int32_t relocated_hits = 0;
  std::int32_t misses = 0;
  std::int32_t tokens_to_compute = 0;
  std::int32_t store_hits = 0;  ///< hits (counted in exact_hits/relocated_hits) from the store

  [[nodiscard]] bool ok() const noexcept { return status == plan_status::kOk; }
  /// Per token (logical position): 1 if its KV comes from the cache (a hit block), the tokens
  /// a dynamic strategy may stop recomputing.
  [[nodiscard]] std::vector<std::uint8_t> reused_mask() const {
    std::vector<std::uint8_t> m(compute.size(), 0);
    for (const planned_block& b : blocks)
      if (b.status != block_status::kMiss)
        for (std::int32_t j = 0; j < b.len; ++j) m[static_cast<std::size_t>(b.pos0 + j)] = 1;
    return m;
  }
  /// The block table attention reads: {physical block, pos0, len} per block.
  [[nodiscard]] std::vector<block_entry> block_table() const {
    std::vector<block_entry> t;
    t.reserve(blocks.size());
    for (const planned_block& b : blocks) t.push_back({b.physical, b.pos0, b.len});
    return t;
  }
};

/// Writes a plan's fetched blocks into the engine's KV storage; call it before the copies.
/// @throws error when a fetch does not fit the storage (another layout)
template <class Storage>
requires kv_block_io<Storage>
void apply_fetches(Storage& storage, std::span<const block_fetch> fetches) {
  const kv_block_layout l = storage.block_layout();
  for (const block_fetch& f : fetches) {
    if (f.len <= 0 || f.len > l.block_size || f.payload.size() != l.payload_bytes(f.len))
      throw error("apply_fetches: a fetch of " + std::to_string(f.payload.size()) + " bytes (" +
                  std::to_string(f.len) + " slots) does not fit the storage's layout");
    storage.write_block(f.dst, f.len, f.payload);
  }
}

RELOKV_NAMESPACE_END
