#pragma once
/// @file
/// Reference-counted block pool with an intrusive O(1) LRU queue of free-but-cached blocks.
#include <cstdint>
#include <string>
#include <vector>

#include "relokv/concepts/block_allocator.hpp"
#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// Block metadata only: KV bytes live in a separate storage object (host_kv_storage or the
/// engine's device memory), indexed by the same block ids.
///
/// Free blocks sit in one intrusive doubly linked list: never-cached blocks at the front (used
/// first), free-but-cached blocks behind them in least-recently-freed order. allocate, retain,
/// release and set_cached are O(1) and never allocate memory.
class lru_block_pool {
 public:
  /// @pre num_blocks > 0
  explicit lru_block_pool(std::int32_t num_blocks) {
    if (num_blocks <= 0)
      throw error("lru_block_pool needs at least one block, got " + std::to_string(num_blocks));
    nodes_.resize(static_cast<std::size_t>(num_blocks) + 1);  // last node: list sentinel
    sentinel_ = num_blocks;
    node(sentinel_).prev = node(sentinel_).next = sentinel_;
    for (block_id b = 0; b < num_blocks; ++b) push_back(b);
    free_ = num_blocks;
  }

  [[nodiscard]] alloc_result allocate() noexcept {
    const block_id b = node(sentinel_).next;
    if (b == sentinel_) return {alloc_status::kOutOfBlocks, kNoBlock, false};
    unlink(b);
    --free_;
    node_t& n = node(b);
    const bool evicted = n.cached;
    n.cached = false;
    n.refs = 1;
    return {alloc_status::kOk, b, evicted};
  }

  void retain(block_id b) noexcept {
    node_t& n = node(b);
    if (n.refs++ == 0) {
      unlink(b);
      --free_;
    }
  }

  void release(block_id b) noexcept {
    node_t& n = node(b);
    RELOKV_ASSERT(n.refs > 0, "release of a block that is not in use");
    if (--n.refs == 0) {
      ++free_;
      if (n.cached) {
        push_back(b);  // most recently freed: evicted last
      } else {
        push_front(b);  // holds nothing worth keeping: reused first
      }
    }
  }

  void set_cached(block_id b, bool cached) noexcept {
    node_t& n = node(b);
    if (n.cached == cached) return;
    n.cached = cached;
    if (n.refs == 0) {  // keep the free list ordered: uncached first
      unlink(b);
      if (cached) {
        push_back(b);
      } else {
        push_front(b);
      }
    }
  }

  [[nodiscard]] std::int32_t capacity() const noexcept { return sentinel_; }
  [[nodiscard]] std::int32_t num_free() const noexcept { return free_; }
  [[nodiscard]] std::int32_t ref_count(block_id b) const noexcept { return node(b).refs; }
  [[nodiscard]] bool is_cached(block_id b) const noexcept { return node(b).cached; }

  /// Free blocks in the order allocate() would hand them out (for tests and debugging).
  [[nodiscard]] std::vector<block_id> free_order() const {
    std::vector<block_id> out;
    for (block_id b = node(sentinel_).next; b != sentinel_; b = node(b).next) out.push_back(b);
    return out;
  }

 private:
  struct node_t {
    block_id prev = kNoBlock;
    block_id next = kNoBlock;
    std::int32_t refs = 0;
    bool cached = false;
  };
  node_t& node(block_id b) noexcept { return nodes_[static_cast<std::size_t>(b)]; }
  const node_t& node(block_id b) const noexcept { return nodes_[static_cast<std::size_t>(b)]; }
  void unlink(block_id b) noexcept {
    node_t& n = node(b);
    node(n.prev).next = n.next;
    node(n.next).prev = n.prev;
    n.prev = n.next = kNoBlock;
  }
  void insert_after(block_id at, block_id b) noexcept {
    node_t& n = node(b);
    n.prev = at;
    n.next = node(at).next;
    node(n.next).prev = b;
    node(at).next = b;
  }
  void push_back(block_id b) noexcept { insert_after(node(sentinel_).prev, b); }
  void push_front(block_id b) noexcept { insert_after(sentinel_, b); }

  std::vector<node_t> nodes_;
  block_id sentinel_ = 0;
  std::int32_t free_ = 0;
};

static_assert(block_allocator<lru_block_pool>, "lru_block_pool must model block_allocator");

RELOKV_NAMESPACE_END
