#pragma once
/// @file
/// Write-behind: a store adapter whose put copies the entries into a bounded queue and returns
/// at once; a worker thread writes them to the store behind it. Gets go straight to the store.
/// With it, commit never waits for the network, and plan never waits for a put.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "relokv/concepts/kv_store.hpp"

RELOKV_NAMESPACE_BEGIN

struct write_behind_options {
  /// Bytes the queue may hold; a put that does not fit is dropped (counted), never waited on.
  std::size_t max_queued_bytes = std::size_t{256} << 20;
  /// Entries the worker writes per put call (one pipeline).
  std::size_t batch = 64;
};

/// @tparam S a kv_store. Two instances are given, one per thread, and they must not share
///         state (two connections to one server, two file_store objects on one directory):
///         `front` serves get, contains and erase on the caller's thread, `back` is the
///         worker's. A memory_store's copies share their map, so it cannot be split this way.
/// A get does not see entries still queued (the engine's pool holds those blocks anyway).
template <class S>
requires kv_store<S>
class write_behind {
 public:
  write_behind(S front, S back, write_behind_options opt = {})
      : front_(std::move(front)), st_(std::make_unique<shared>(std::move(back), opt)) {
    st_->worker = std::thread([s = st_.get()] { s->run(); });
  }
  /// A moved-from write_behind is an unavailable store: every call answers kUnavailable (or
  /// nothing queued), none touches the state that moved away.
  write_behind(write_behind&&) noexcept = default;
  write_behind& operator=(write_behind&&) = delete;
  /// Writes what is queued, then stops the worker.
  ~write_behind() {
    if (!st_) return;
    {
      std::lock_guard<std::mutex> lk(st_->m);
      st_->stop = true;
    }
    st_->cv.notify_all();
    st_->worker.join();
  }

  store_status get(std::span<const store_key> keys, std::vector<store_blob>& out) {
    if (!st_) return store_status::kUnavailable;
    return front_.get(keys, out);
  }
  /// Queues copies of the entries; those that do not fit are dropped (counters().put_rejected).
  store_status put(std::span<const store_key> keys,
                   std::span<const std::span<const std::byte>> values) {
    if (!st_) return store_status::kUnavailable;
    shared& s = *st_;
    bool all = true;
    {
      std::lock_guard<std::mutex> lk(s.m);
      ++s.queued_calls;
      for (std::size_t i = 0; i < keys.size() && i < values.size(); ++i) {
        if (s.bytes + values[i].size() > s.opt.max_queued_bytes) {
          ++s.dropped;
          all = false;
          continue;
        }
        s.bytes += values[i].size();
        s.q.push_back({keys[i], std::vector<std::byte>(values[i].begin(), values[i].end())});
      }
    }
    s.cv.notify_one();
    return all ? store_status::kOk : store_status::kUnavailable;
  }
  store_status contains(std::span<const store_key> keys, std::vector<std::uint8_t>& out) {
    if (!st_) return store_status::kUnavailable;
    return front_.contains(keys, out);
  }
  store_status erase(std::span<const store_key> keys) {
    if (!st_) return store_status::kUnavailable;
    return front_.erase(keys);
  }

  /// Reads go through the front store: it takes the bound.
  void limit_value_bytes(std::size_t n) {
    if constexpr (requires { front_.limit_value_bytes(n); }) front_.limit_value_bytes(n);
  }
  /// The front store's counts for reads; writes as the worker has done them (keys_written
  /// grows when an entry reaches the store), plus the entries the queue dropped.
  [[nodiscard]] store_counters counters() const {
    if (!st_) return {};
    store_counters c = front_.counters();
    std::lock_guard<std::mutex> lk(st_->m);
    c.put_calls = st_->queued_calls;
    c.keys_written = st_->back_counters.keys_written;
    c.bytes_written = st_->back_counters.bytes_written;
    c.put_rejected = st_->back_counters.put_rejected + st_->dropped;
    c.unavailable += st_->back_counters.unavailable;
    c.reconnects += st_->back_counters.reconnects;
    return c;
  }
  /// Blocks until every queued entry has been handed to the store behind.
  void flush() {
    if (!st_) return;
    std::unique_lock<std::mutex> lk(st_->m);
    st_->idle.wait(lk, [this] { return st_->q.empty() && !st_->writing; });
  }
  /// Entries waiting, and their bytes.
  [[nodiscard]] std::pair<std::size_t, std::size_t> queued() const {
    if (!st_) return {0, 0};
    std::lock_guard<std::mutex> lk(st_->m);
    return {st_->q.size(), st_->bytes};
  }

 private:
  struct entry {
    store_key key;
    std::vector<std::byte> bytes;
  };
  struct shared {
    shared(S b, write_behind_options o) : back(std::move(b)), opt(o) {}
    void run() {
      std::vector<entry> batch;
      std::vector<store_key> keys;
      std::vector<std::span<const std::byte>> views;
      std::unique_lock<std::mutex> lk(m);
      for (;;) {
        cv.wait(lk, [this] { return stop || !q.empty(); });
        if (q.empty()) break;  // stop, and nothing left
        batch.clear();
        while (!q.empty() && batch.size() < opt.batch) {
          batch.push_back(std::move(q.front()));
          q.pop_front();
        }
        writing = true;
        lk.unlock();
        keys.clear();
        views.clear();
        for (const entry& e : batch) {
          keys.push_back(e.key);
          views.emplace_back(e.bytes);
        }
        (void)back.put(keys, views);
        const store_counters c = back.counters();
        lk.lock();
        back_counters = c;
        for (const entry& e : batch) bytes -= e.bytes.size();
        writing = false;
        if (q.empty()) idle.notify_all();
      }
      writing = false;
      idle.notify_all();
    }
    S back;
    write_behind_options opt;
    mutable std::mutex m;
    std::condition_variable cv, idle;
    std::deque<entry> q;
    std::size_t bytes = 0;
    std::int64_t dropped = 0, queued_calls = 0;
    store_counters back_counters;
    bool stop = false, writing = false;
    std::thread worker;
  };
  S front_;
  std::unique_ptr<shared> st_;
};

static_assert(kv_store<write_behind<no_store>>, "write_behind must model kv_store");

RELOKV_NAMESPACE_END
