#pragma once
/// @file
/// A store in this process's memory: for tests, and as the model of the kv_store contract.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "relokv/concepts/kv_store.hpp"

RELOKV_NAMESPACE_BEGIN

/// Entries in a hash map, copied in on put and shared out on get (a get never copies).
/// Copies of a memory_store share its entries, as handles to one server would.
class memory_store {
 public:
  memory_store() : state_(std::make_shared<state>()) {}

  store_status get(std::span<const store_key> keys, std::vector<store_blob>& out) {
    state& s = *state_;
    ++s.counters.get_calls;
    s.counters.keys_requested += static_cast<std::int64_t>(keys.size());
    out.assign(keys.size(), store_blob{});
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto it = s.map.find(keys[i]);
      if (it == s.map.end()) continue;
      const std::shared_ptr<const std::vector<std::byte>>& v = it->second;
      out[i] = store_blob(v, std::span<const std::byte>(v->data(), v->size()));
      ++s.counters.keys_found;
      s.counters.bytes_read += static_cast<std::int64_t>(v->size());
    }
    return store_status::kOk;
  }
  store_status put(std::span<const store_key> keys,
                   std::span<const std::span<const std::byte>> values) {
    state& s = *state_;
    ++s.counters.put_calls;
    for (std::size_t i = 0; i < keys.size() && i < values.size(); ++i) {
      s.map[keys[i]] =
          std::make_shared<const std::vector<std::byte>>(values[i].begin(), values[i].end());
      ++s.counters.keys_written;
      s.counters.bytes_written += static_cast<std::int64_t>(values[i].size());
    }
    return store_status::kOk;
  }
  store_status contains(std::span<const store_key> keys, std::vector<std::uint8_t>& out) const {
    out.assign(keys.size(), 0);
    for (std::size_t i = 0; i < keys.size(); ++i) out[i] = state_->map.count(keys[i]) ? 1 : 0;
    return store_status::kOk;
  }
  store_status erase(std::span<const store_key> keys) {
    for (const store_key& k : keys) state_->map.erase(k);
    return store_status::kOk;
  }
  [[nodiscard]] store_counters counters() const noexcept { return state_->counters; }

  /// Entries held.
  [[nodiscard]] std::size_t size() const noexcept { return state_->map.size(); }
  /// The keys held, for tests that tamper with entries.
  [[nodiscard]] std::vector<store_key> keys() const {
    std::vector<store_key> k;
    for (const auto& e : state_->map) k.push_back(e.first);
    return k;
  }
  /// Replaces an entry's bytes without any check (tests: corruption, truncation, forgery).
  void overwrite(const store_key& k, std::vector<std::byte> bytes) {
    state_->map[k] = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  }
  /// An entry's bytes (empty when absent).
  [[nodiscard]] std::vector<std::byte> bytes_of(const store_key& k) const {
    const auto it = state_->map.find(k);
    return it == state_->map.end() ? std::vector<std::byte>{} : *it->second;
  }

 private:
  struct key_hash {
    std::size_t operator()(const store_key& k) const noexcept {
      return static_cast<std::size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull));
    }
  };
  struct state {
    std::unordered_map<store_key, std::shared_ptr<const std::vector<std::byte>>, key_hash> map;
    store_counters counters;
  };
  std::shared_ptr<state> state_;
};

static_assert(kv_store<memory_store>, "memory_store must model kv_store");

RELOKV_NAMESPACE_END
