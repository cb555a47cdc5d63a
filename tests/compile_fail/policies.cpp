// Compile-fail tests for the five policy axes. Compiled by ctest (label compile_fail) with
// -DRELOKV_BREAK_<AXIS>, which removes one member that the axis's concept requires: the
// compilation must fail (WILL_FAIL) and say that the policy must model the concept (a regex).
// Compiled without any RELOKV_BREAK_ macro it must succeed (compile_fail.control), so that
// each failure comes from the missing member alone.
#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/memory/lru_block_pool.hpp>
#include <relokv/store/memory_store.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

struct hash_policy {
  using key_type = std::uint64_t;
  [[nodiscard]] key_type digest(std::span<const std::byte> b, relokv::hash_domain,
                                std::uint64_t = 0) const {
    return b.size();
  }
  [[nodiscard]] key_type combine(key_type a, key_type b, relokv::hash_domain) const {
    return a * 31 + b;
  }
#ifndef RELOKV_BREAK_HASH
  [[nodiscard]] static std::size_t bucket(key_type k) { return static_cast<std::size_t>(k); }
#endif
};

struct allocator_policy {
  relokv::lru_block_pool pool{8};
  relokv::alloc_result allocate() { return pool.allocate(); }
  void retain(relokv::block_id b) { pool.retain(b); }
  void release(relokv::block_id b) { pool.release(b); }
#ifndef RELOKV_BREAK_ALLOCATOR
  void set_cached(relokv::block_id b, bool cached) { pool.set_cached(b, cached); }
#endif
  [[nodiscard]] std::int32_t capacity() const { return pool.capacity(); }
  [[nodiscard]] std::int32_t num_free() const { return pool.num_free(); }
  [[nodiscard]] std::int32_t ref_count(relokv::block_id b) const { return pool.ref_count(b); }
  [[nodiscard]] bool is_cached(relokv::block_id b) const { return pool.is_cached(b); }
};

struct placement_policy {
  static constexpr relokv::placement_kind kind = relokv::placement_kind::kAtAttention;
  static constexpr bool relocation_rotates_keys = false;
#ifndef RELOKV_BREAK_PLACEMENT
  static constexpr relokv::pos_t stored_position(relokv::pos_t, std::int32_t) noexcept { return 0; }
#endif
};

struct strategy_policy {
  void select(const relokv::request_layout&, std::span<const relokv::block_status>,
              std::span<std::uint8_t>) const {}
#ifndef RELOKV_BREAK_STRATEGY
  [[nodiscard]] bool dynamic() const { return false; }
#endif
};

struct store_policy {
  relokv::memory_store s;
  relokv::store_status get(std::span<const relokv::store_key> k,
                           std::vector<relokv::store_blob>& o) {
    return s.get(k, o);
  }
  relokv::store_status put(std::span<const relokv::store_key> k,
                           std::span<const std::span<const std::byte>> v) {
    return s.put(k, v);
  }
  relokv::store_status contains(std::span<const relokv::store_key> k,
                                std::vector<std::uint8_t>& o) {
    return s.contains(k, o);
  }
#ifndef RELOKV_BREAK_STORE
  relokv::store_status erase(std::span<const relokv::store_key> k) { return s.erase(k); }
#endif
  [[nodiscard]] relokv::store_counters counters() const { return s.counters(); }
};

int main() {
  relokv::relocatable_cache<hash_policy, allocator_policy, placement_policy, strategy_policy,
                            store_policy>
      cache(allocator_policy{}, 16);
  const std::vector<relokv::token_t> t = {1, 2, 3};
  const auto plan = cache.plan(relokv::layout_builder(16).prefix(t).build());
  return plan.ok() ? 0 : 1;
}
