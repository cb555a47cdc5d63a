#pragma once
/// @file
/// Non-owning, trivially copyable views of paged KV memory and block tables (host and device).
#include <cstdint>
#include <string>
#include <type_traits>

#include "relokv/block_table.hpp"
#include "relokv/config.hpp"
#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// One layer of a paged KV pool:
///   // [num_blocks][2 (k|v)][num_kv_heads][block_size][head_dim]
/// @tparam T float, bf16 or fp16 (const-qualified for read-only views).
template <class T>
struct paged_kv_view {
  T* data = nullptr;
  std::int32_t num_blocks = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t block_size = 0;
  std::int32_t head_dim = 0;

  RELOKV_HOST_DEVICE std::int64_t tile_elems() const {
    return static_cast<std::int64_t>(block_size) * head_dim;
  }
  /// K tile of (block, head): [block_size][head_dim].
  RELOKV_HOST_DEVICE T* k(block_id block, std::int32_t head) const {
    return data + (static_cast<std::int64_t>(block) * 2 * num_kv_heads + head) * tile_elems();
  }
  /// V tile of (block, head): [block_size][head_dim].
  RELOKV_HOST_DEVICE T* v(block_id block, std::int32_t head) const {
    return data + ((static_cast<std::int64_t>(block) * 2 + 1) * num_kv_heads + head) * tile_elems();
  }
  /// A read-only view of the same memory.
  template <class U = T>
  requires(!std::is_const_v<U>) RELOKV_HOST_DEVICE operator paged_kv_view<const U>() const {
    return {data, num_blocks, num_kv_heads, block_size, head_dim};
  }
};

/// Block tables of a batch in CSR form: sequence s reads entries[indptr[s] .. indptr[s+1]),
/// each {physical block, pos0, len}. Blocks may appear in several sequences, at any pos0.
struct block_table_view {
  const block_entry* entries = nullptr;
  const std::int32_t* indptr = nullptr;  ///< num_seqs + 1 offsets
  std::int32_t num_seqs = 0;
};

/// Checks a block table against the view it will index, in one pass over its entries: CSR
/// offsets ordered, every block inside the view, every length a valid slot count. The host
/// attention calls run it once per call (in can_implement), before any kernel reads.
/// @returns ok, or the reason naming the offending sequence or entry.
[[nodiscard]] inline support validate_block_table(block_table_view table, std::int32_t num_blocks,
                                                  std::int32_t block_size) {
  if (table.num_seqs < 0) return {false, "attention: negative num_seqs"};
  if (table.num_seqs == 0) return {};
  if (table.indptr == nullptr || table.indptr[0] != 0)
    return {false, "attention: block table indptr must start at 0"};
  for (std::int32_t s = 0; s < table.num_seqs; ++s)
    if (table.indptr[s + 1] < table.indptr[s])
      return {false, "attention: block table indptr decreases at sequence " + std::to_string(s)};
  const std::int32_t n = table.indptr[table.num_seqs];
  if (n > 0 && table.entries == nullptr) return {false, "attention: null block table entries"};
  for (std::int32_t i = 0; i < n; ++i) {
    const block_entry& e = table.entries[i];
    if (e.block < 0 || e.block >= num_blocks || e.len < 0 || e.len > block_size)
      return {false, "attention: block table entry " + std::to_string(i) + " {block " +
                         std::to_string(e.block) + ", len " + std::to_string(e.len) +
                         "} outside the view of " + std::to_string(num_blocks) + " blocks of " +
                         std::to_string(block_size)};
  }
  return {};
}

/// validate_block_table, throwing.
/// @throws error naming the offending sequence or entry.
inline void check_block_table(block_table_view table, std::int32_t num_blocks,
                              std::int32_t block_size) {
  if (auto s = validate_block_table(table, num_blocks, block_size); !s) throw error(s.reason);
}

static_assert(std::is_trivially_copyable_v<paged_kv_view<float>>);
static_assert(std::is_trivially_copyable_v<block_table_view>);
static_assert(std::is_trivially_copyable_v<block_entry>);

RELOKV_NAMESPACE_END
