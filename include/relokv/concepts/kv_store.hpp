#pragma once
/// @file
/// The KV-store policy axis: where serialized blocks outlive a process (memory, files, Redis).
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// The key of one stored block: 128 bits derived from the model fingerprint, the tenant's
/// extra keys and the block's cache key (see store/block_format.hpp).
struct store_key {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  friend constexpr bool operator==(const store_key&, const store_key&) = default;
  /// 32 lowercase hex digits (hi then lo): the name stores give the entry.
  [[nodiscard]] std::string hex() const {
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                  static_cast<unsigned long long>(lo));
    return std::string(buf, 32);
  }
};

/// The bytes of one fetched entry, kept alive by whatever holds them (a vector, a file
/// mapping, a server reply) for as long as any copy of the blob exists. Empty: no entry.
class store_blob {
 public:
  store_blob() = default;
  store_blob(std::shared_ptr<const void> owner, std::span<const std::byte> bytes) noexcept
      : owner_(std::move(owner)), bytes_(bytes) {}
  /// A blob that owns a copy of `bytes`.
  [[nodiscard]] static store_blob copy_of(std::span<const std::byte> bytes) {
    auto v = std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
    const std::span<const std::byte> view(v->data(), v->size());
    return {std::move(v), view};
  }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_.size(); }
  [[nodiscard]] bool empty() const noexcept { return owner_ == nullptr; }

 private:
  std::shared_ptr<const void> owner_;
  std::span<const std::byte> bytes_;
};

/// Outcome of one store call, for the whole batch.
enum class store_status : std::uint8_t {
  kOk,           ///< answered: per-key results are valid
  kUnavailable,  ///< not answered (server down, timed out, I/O error): treat every key as a
                 ///< miss (get) or as not written (put); the store retries on a later call
};

/// What a store counted, for reports and fault tests.
struct store_counters {
  std::int64_t get_calls = 0, keys_requested = 0, keys_found = 0;
  std::int64_t put_calls = 0, keys_written = 0, put_rejected = 0;  ///< rejected: e.g. OOM
  std::int64_t bytes_read = 0, bytes_written = 0;
  std::int64_t unavailable = 0;    ///< calls answered kUnavailable
  std::int64_t reconnects = 0;     ///< connections re-established after a failure
  std::int64_t auth_failures = 0;  ///< logins the server refused (wrong user or password)
  std::int64_t denied = 0;     ///< keys the server refused to this user (Redis ACL NOPERM): misses
  std::int64_t timeouts = 0;   ///< calls that reached their deadline (a slow or silent server)
  std::int64_t oversized = 0;  ///< replies or entries larger than any block: refused unread
  std::int64_t malformed = 0;  ///< replies of a shape no command sent asks for (an array)
  /// Entries a sealed_store could not open (another key, forged, edited or unsealed): misses.
  std::int64_t open_failures = 0;
};

/// What one server of a store that spreads entries over several (redis_cluster_store) served,
/// for reports: the demo's blocks per node. Stores on one server have none.
struct store_node_stats {
  std::string name;  ///< host:port
  bool master = false;
  std::int64_t keys_read = 0;     ///< entries found on it
  std::int64_t keys_written = 0;  ///< entries it stored
  std::int64_t pipelines = 0;     ///< pipelines sent to it
  std::int64_t failures = 0;      ///< calls in which it was down, slow or gone mid-reply
};

/// A store of serialized blocks by key.
///
/// Requirements (batched: one round trip per call where the store has round trips):
///  - `s.get(keys, out)`: out is resized to keys.size(); out[i] holds the entry stored under
///    keys[i] as it was put, or is empty when there is none. The store does not interpret
///    entries: a corrupt, truncated or foreign one comes back as it is, and the reader rejects
///    it (store/block_format.hpp checks magic, sizes, fingerprint, identity and checksum);
///  - `s.put(keys, values)`: stores values[i] under keys[i], replacing what was there. An entry
///    is whole or absent, never torn. A store may refuse or later drop entries (memory limits,
///    eviction): a put is a hint, never a promise, and a later get may miss;
///  - `s.contains(keys, out)`: out[i] = 1 where an entry exists now;
///  - `s.erase(keys)`: removes the entries (absent ones are fine);
///  - `s.counters()`: what it counted.
/// A store that cannot answer (server down, timeout, I/O error) returns kUnavailable, leaves
/// `out` all empty (0) and never throws for it: a request then computes what it would have
/// fetched. Stores throw relokv::error only for bad configuration, when they are constructed.
/// Calls come from one thread at a time (the cache's owner), like the cache's own.
template <class S>
concept kv_store = requires(S& s, const S& cs, std::span<const store_key> keys,
                            std::span<const std::span<const std::byte>> values,
                            std::vector<store_blob>& blobs, std::vector<std::uint8_t>& flags) {
  { s.get(keys, blobs) } -> std::same_as<store_status>;
  { s.put(keys, values) } -> std::same_as<store_status>;
  { s.contains(keys, flags) } -> std::same_as<store_status>;
  { s.erase(keys) } -> std::same_as<store_status>;
  { cs.counters() } -> std::convertible_to<store_counters>;
};

/// The layout of a block's K and V, as a KV storage holds it and the block format carries it.
struct kv_block_layout {
  std::int32_t num_layers = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t block_size = 0;
  std::uint8_t dtype_code = 0;  ///< relokv::dtype
  std::uint8_t elem_bytes = 0;  ///< bytes per element
  friend constexpr bool operator==(const kv_block_layout&, const kv_block_layout&) = default;
  /// Bytes of the K and V of `len` slots, every layer and head: the payload of a stored block.
  [[nodiscard]] constexpr std::size_t payload_bytes(std::int32_t len) const noexcept {
    return 2u * static_cast<std::size_t>(num_layers) * static_cast<std::size_t>(num_kv_heads) *
           static_cast<std::size_t>(len) * static_cast<std::size_t>(head_dim) * elem_bytes;
  }
};

/// KV storage that blocks can be serialized from and written back into (host_kv_storage does;
/// a GPU engine wraps its device pool with staging copies).
///
/// Requirements:
///  - `s.block_layout()`: its kv_block_layout;
///  - `s.read_block(b, len, out)`: writes slots [0, len) of block b into out, every layer, in
///    the payload order [layer][k|v][kv_head][slot][head_dim] (out.size() == payload_bytes);
///  - `s.write_block(b, len, in)`: the inverse, into slots [0, len) of block b.
template <class S>
concept kv_block_io = requires(S& s, const S& cs, block_id b, std::int32_t len,
                               std::span<std::byte> out, std::span<const std::byte> in) {
  { cs.block_layout() } -> std::same_as<kv_block_layout>;
  cs.read_block(b, len, out);
  s.write_block(b, len, in);
};

/// The store of a cache that has none: every get misses, every put is dropped. The cache
/// compiles its store tier away for it.
struct no_store {
  store_status get(std::span<const store_key> keys, std::vector<store_blob>& out) const {
    out.assign(keys.size(), store_blob{});
    return store_status::kOk;
  }
  store_status put(std::span<const store_key>, std::span<const std::span<const std::byte>>) const {
    return store_status::kOk;
  }
  store_status contains(std::span<const store_key> keys, std::vector<std::uint8_t>& out) const {
    out.assign(keys.size(), 0);
    return store_status::kOk;
  }
  store_status erase(std::span<const store_key>) const { return store_status::kOk; }
  [[nodiscard]] store_counters counters() const noexcept { return {}; }
};

static_assert(kv_store<no_store>, "no_store must model kv_store");

RELOKV_NAMESPACE_END
