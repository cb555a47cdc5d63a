#pragma once
/// @file
/// Non-owning, trivially copyable views of paged KV memory and block tables (host and device).
#include <cstdint>
#include <type_traits>

#include "relokv/cache/reuse_plan.hpp"
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

static_assert(std::is_trivially_copyable_v<paged_kv_view<float>>);
static_assert(std::is_trivially_copyable_v<block_table_view>);
static_assert(std::is_trivially_copyable_v<block_entry>);

RELOKV_NAMESPACE_END
