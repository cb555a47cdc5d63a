#pragma once
/// @file
/// A store chosen at run time (a command-line flag, a config file): one type for the cache's
/// KvStore parameter over memory_store, file_store and, in programs that link relokv::redis,
/// redis_store.
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "relokv/concepts/kv_store.hpp"
#include "relokv/store/file_store.hpp"
#include "relokv/store/memory_store.hpp"
#include "relokv/store/sealed_store.hpp"
#include "relokv/store/store_url.hpp"
#if defined(RELOKV_WITH_REDIS) && RELOKV_WITH_REDIS
#include "relokv/store/redis_cluster_store.hpp"
#include "relokv/store/redis_store.hpp"
#endif

RELOKV_NAMESPACE_BEGIN

/// Type-erased kv_store. Default-constructed it holds none: gets miss, puts are dropped.
class any_store {
 public:
  any_store() = default;
  template <class S>
  requires(kv_store<S> && !std::is_same_v<std::remove_cvref_t<S>, any_store>) explicit any_store(
      S store, std::string description = {})
      : p_(std::make_unique<holder<S>>(std::move(store))), what_(std::move(description)) {}

  /// `memory:`, `file:DIR[?prefix=TENANT]`, or a Redis URL (`redis://[USER[:PASSWORD]@]HOST
  /// [:PORT][/DB][?prefix=P]`, `unix:///PATH[?db=N]`; see redis_store_options::from_url), or a
  /// Redis Cluster URL (`redis-cluster://HOST:PORT[,HOST:PORT...]`; see
  /// redis_cluster_options::from_url). Redis
  /// needs RELOKV_WITH_REDIS, which linking relokv::redis defines. description() is the URL
  /// with any password redacted.
  /// @throws error for an unknown scheme, a bad URL or a directory that cannot be made
  [[nodiscard]] static any_store from_url(const std::string& url) {
    return make(url, [](auto store, std::string what) {
      return any_store(std::move(store), std::move(what));
    });
  }

  /// As from_url(url), sealed (sealed_store over the concrete store, so that a Redis store
  /// opens entries as they arrive) with the key `seal` names, when it names one.
  /// description() then ends in " (sealed)".
  /// @throws error as from_url, and when the key cannot be loaded (seal_options::load)
  [[nodiscard]] static any_store from_url(const std::string& url, const seal_options& seal) {
    if (!seal.enabled()) return from_url(url);
    const seal_key key = seal.load();
    return make(url, [&key](auto store, std::string what) {
      using S = decltype(store);
      return any_store(sealed_store<S>(std::move(store), key), std::move(what) + " (sealed)");
    });
  }

  explicit operator bool() const noexcept { return p_ != nullptr; }
  /// What it was made from (the URL), for reports.
  [[nodiscard]] const std::string& description() const noexcept { return what_; }

 private:
  /// Opens the store a URL names and hands it, with its description, to wrap.
  template <class Wrap>
  static any_store make(const std::string& url, Wrap&& wrap) {
    const std::string shown = redact_url(url);
    if (url == "memory:") return wrap(memory_store{}, url);
    if (url.rfind("file:", 0) == 0) {
      std::string dir = url.substr(5);
      file_store_options o;
      if (const auto q = dir.rfind("?prefix="); q != std::string::npos) {
        o.prefix = dir.substr(q + 8);
        dir.resize(q);
      }
      if (dir.empty()) throw error("store URL '" + url + "': file: needs a directory");
      return wrap(file_store(dir, o), url);
    }
    if (url.rfind("redis://", 0) == 0 || url.rfind("rediss://", 0) == 0 ||
        url.rfind("unix://", 0) == 0 || url.rfind("redis-cluster://", 0) == 0) {
#if defined(RELOKV_WITH_REDIS) && RELOKV_WITH_REDIS
      if (url.rfind("redis-cluster://", 0) == 0)
        return wrap(redis_cluster_store(redis_cluster_options::from_url(url)), shown);
      return wrap(redis_store(redis_store_options::from_url(url)), shown);
#else
      throw error("store URL '" + shown +
                  "': this program was built without Redis (link "
                  "relokv::redis, or define RELOKV_WITH_REDIS=1 and link hiredis)");
#endif
    }
    throw error("store URL '" + shown +
                "': expected memory:, file:DIR, redis://HOST[:PORT] (or unix:///PATH) or "
                "redis-cluster://HOST:PORT[,HOST:PORT...]");
  }

 public:
  store_status get(std::span<const store_key> keys, std::vector<store_blob>& out) {
    if (!p_) {
      out.assign(keys.size(), store_blob{});
      return store_status::kOk;
    }
    return p_->get(keys, out);
  }
  store_status put(std::span<const store_key> keys,
                   std::span<const std::span<const std::byte>> values) {
    return p_ ? p_->put(keys, values) : store_status::kOk;
  }
  store_status contains(std::span<const store_key> keys, std::vector<std::uint8_t>& out) {
    if (!p_) {
      out.assign(keys.size(), 0);
      return store_status::kOk;
    }
    return p_->contains(keys, out);
  }
  store_status erase(std::span<const store_key> keys) {
    return p_ ? p_->erase(keys) : store_status::kOk;
  }
  [[nodiscard]] store_counters counters() const { return p_ ? p_->counters() : store_counters{}; }
  /// What each server served, for a store spread over several (a Redis Cluster); empty for
  /// the others.
  [[nodiscard]] std::vector<store_node_stats> node_stats() const {
    return p_ ? p_->node_stats() : std::vector<store_node_stats>{};
  }
  /// Forwards the cache's bound on one entry to a store that reads with one (redis_store,
  /// file_store, and the adapters over them).
  void limit_value_bytes(std::size_t n) {
    if (p_) p_->limit_value_bytes(n);
  }

 private:
  struct base {
    virtual ~base() = default;
    virtual store_status get(std::span<const store_key>, std::vector<store_blob>&) = 0;
    virtual store_status put(std::span<const store_key>,
                             std::span<const std::span<const std::byte>>) = 0;
    virtual store_status contains(std::span<const store_key>, std::vector<std::uint8_t>&) = 0;
    virtual store_status erase(std::span<const store_key>) = 0;
    [[nodiscard]] virtual store_counters counters() const = 0;
    virtual void limit_value_bytes(std::size_t) = 0;
    [[nodiscard]] virtual std::vector<store_node_stats> node_stats() const = 0;
  };
  template <class S>
  struct holder final : base {
    explicit holder(S st) : s(std::move(st)) {}
    store_status get(std::span<const store_key> k, std::vector<store_blob>& o) override {
      return s.get(k, o);
    }
    store_status put(std::span<const store_key> k,
                     std::span<const std::span<const std::byte>> v) override {
      return s.put(k, v);
    }
    store_status contains(std::span<const store_key> k, std::vector<std::uint8_t>& o) override {
      return s.contains(k, o);
    }
    store_status erase(std::span<const store_key> k) override { return s.erase(k); }
    [[nodiscard]] store_counters counters() const override { return s.counters(); }
    void limit_value_bytes(std::size_t n) override {
      if constexpr (requires { s.limit_value_bytes(n); }) s.limit_value_bytes(n);
    }
    [[nodiscard]] std::vector<store_node_stats> node_stats() const override {
      if constexpr (requires { s.node_stats(); })
        return s.node_stats();
      else
        return {};
    }
    S s;
  };
  std::unique_ptr<base> p_;
  std::string what_;
};

static_assert(kv_store<any_store>, "any_store must model kv_store");

RELOKV_NAMESPACE_END
