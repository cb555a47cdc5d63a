#pragma once
/// @file
/// Prefetching: store reads off the cache owner's thread. A store adapter whose get answers
/// only from entries a worker thread fetched ahead (store_prefetcher::prefetch, from any
/// thread, with the keys relocatable_cache::store_keys names for a waiting request), so that a
/// plan never waits for the network: the request waits for its ticket in its own state while
/// the owner thread goes on with the others. Puts, contains and erase go to the front store on
/// the caller's thread (wrap it in write_behind to take puts off it too).
///
///   relokv::prefetching_store<S> st(front, fetcher);   // two connections, as write_behind's
///   relokv::store_prefetcher pre = st.prefetcher();     // kept by the scheduler
///   ...cache over std::move(st)...
///   cache.store_keys(layout, strategy, extras, keys);   // on the owner thread
///   auto t = pre.prefetch(keys, [&] { wake(); });       // fetched on the worker
///   ...later, when t->ready(): cache.plan(layout, ...)  // finds them staged; then drop t
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "relokv/concepts/kv_store.hpp"

RELOKV_NAMESPACE_BEGIN

struct prefetch_options {
  /// Bytes the staged entries may hold at once; an entry found past it is dropped (counted),
  /// and its block is computed by the request that wanted it.
  std::size_t max_staged_bytes = std::size_t{256} << 20;
};

/// What a prefetching_store counted (prefetcher().counters()).
struct prefetch_counters {
  std::int64_t requests = 0;      ///< prefetch() calls with keys to fetch
  std::int64_t keys = 0;          ///< keys those asked for
  std::int64_t found = 0;         ///< entries the store had, staged
  std::int64_t dropped = 0;       ///< entries found that did not fit max_staged_bytes
  std::int64_t served = 0;        ///< keys a get answered from what was staged
  std::int64_t unstaged = 0;      ///< keys a get asked for that were not staged: misses
  std::int64_t cancelled = 0;     ///< tickets dropped before their fetch ran (not fetched)
  std::int64_t staged_bytes = 0;  ///< bytes staged now
  std::int64_t staged_entries = 0;
};

namespace detail {

struct store_key_hasher {
  std::size_t operator()(const store_key& k) const noexcept {
    return static_cast<std::size_t>(k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull));
  }
};

/// The worker, the staged entries and the queue of fetches, shared by the store, its
/// prefetcher handles and their tickets; the fetching store behind it is erased (fetch()).
class prefetch_core : public std::enable_shared_from_this<prefetch_core> {
 public:
  explicit prefetch_core(prefetch_options o) : opt_(o) {}
  virtual ~prefetch_core() = default;
  prefetch_core(const prefetch_core&) = delete;
  prefetch_core& operator=(const prefetch_core&) = delete;

  struct job;
  struct ticket_state {
    std::shared_ptr<prefetch_core> core;
    std::vector<store_key> staged;  ///< the keys this ticket holds a reference on
    std::atomic<bool> ready{false};
    /// Held while the callback runs; `abandoned` (the ticket dropped) stops later callbacks.
    std::mutex cb_m;
    bool abandoned = false;
    ~ticket_state() {
      if (core) core->unstage(staged);
    }
  };
  struct job {
    std::weak_ptr<ticket_state> ticket;
    std::vector<store_key> keys;
    std::function<void()> on_ready;
  };

  void start() {
    worker_ = std::thread([this] { run(); });
  }
  /// Ends the worker: fetches not begun are not made (their tickets become ready with nothing
  /// staged and their callbacks run), the one under way finishes.
  void stop() {
    {
      const std::lock_guard<std::mutex> lk(m_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  std::shared_ptr<ticket_state> prefetch(std::span<const store_key> keys,
                                         std::function<void()> on_ready) {
    auto t = std::make_shared<ticket_state>();
    t->core = shared_from_this();
    {
      const std::lock_guard<std::mutex> lk(m_);
      if (keys.empty() || stopping_) {
        t->ready.store(true, std::memory_order_release);
        return t;
      }
      ++c_.requests;
      c_.keys += static_cast<std::int64_t>(keys.size());
      q_.push_back(job{t, std::vector<store_key>(keys.begin(), keys.end()), std::move(on_ready)});
    }
    cv_.notify_one();
    return t;
  }

  /// The owner thread's get: staged entries, misses for the rest.
  void read(std::span<const store_key> keys, std::vector<store_blob>& out) {
    out.assign(keys.size(), store_blob{});
    const std::lock_guard<std::mutex> lk(m_);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto it = staged_.find(keys[i]);
      if (it == staged_.end()) {
        ++c_.unstaged;
        continue;
      }
      out[i] = it->second.blob;
      ++c_.served;
    }
  }

  void limit_value_bytes(std::size_t n) { limit_.store(n, std::memory_order_relaxed); }

  [[nodiscard]] prefetch_counters counters() const {
    const std::lock_guard<std::mutex> lk(m_);
    prefetch_counters c = c_;
    c.staged_bytes = static_cast<std::int64_t>(bytes_);
    c.staged_entries = static_cast<std::int64_t>(staged_.size());
    return c;
  }
  /// The fetching store's counters as of its last fetch.
  [[nodiscard]] store_counters fetcher_counters() const {
    const std::lock_guard<std::mutex> lk(m_);
    return fetcher_c_;
  }

 protected:
  /// One batched get on the fetching store (the worker's thread only).
  virtual store_status fetch(std::span<const store_key> keys, std::vector<store_blob>& out) = 0;
  virtual void apply_limit(std::size_t n) = 0;
  [[nodiscard]] virtual store_counters fetch_counters() const = 0;

 private:
  struct staged_entry {
    store_blob blob;
    std::int32_t refs = 0;
  };

  void unstage(const std::vector<store_key>& keys) {
    if (keys.empty()) return;
    const std::lock_guard<std::mutex> lk(m_);
    for (const store_key& k : keys) {
      const auto it = staged_.find(k);
      if (it == staged_.end() || --it->second.refs > 0) continue;
      bytes_ -= it->second.blob.size();
      staged_.erase(it);
    }
  }

  void run() {
    std::vector<store_blob> blobs;
    std::size_t applied = 0;
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      cv_.wait(lk, [this] { return stopping_ || !q_.empty(); });
      if (stopping_) break;
      job j = std::move(q_.front());
      q_.pop_front();
      std::shared_ptr<ticket_state> t = j.ticket.lock();
      if (!t) {  // its request went away before its turn
        ++c_.cancelled;
        continue;
      }
      lk.unlock();
      if (const std::size_t n = limit_.load(std::memory_order_relaxed); n != applied) {
        apply_limit(n);
        applied = n;
      }
      blobs.clear();
      const bool ok = fetch(j.keys, blobs) == store_status::kOk && blobs.size() == j.keys.size();
      const store_counters fc = fetch_counters();
      lk.lock();
      fetcher_c_ = fc;
      if (ok) stage(j.keys, blobs, *t);
      t->ready.store(true, std::memory_order_release);
      lk.unlock();
      notify(*t, j.on_ready);
      t.reset();  // may be the last reference: its destructor unstages, taking the lock
      lk.lock();
    }
    // Stopping: what is queued is not fetched; its waiters go on without it.
    std::deque<job> left;
    left.swap(q_);
    lk.unlock();
    for (job& j : left)
      if (const auto t = j.ticket.lock()) {
        t->ready.store(true, std::memory_order_release);
        notify(*t, j.on_ready);
      }
  }

  /// The callback, unless the ticket was dropped: once a ticket's destructor returns, its
  /// callback is neither running nor to come (what it calls may be gone).
  static void notify(ticket_state& t, const std::function<void()>& on_ready) {
    if (!on_ready) return;
    const std::lock_guard<std::mutex> g(t.cb_m);
    if (!t.abandoned) on_ready();
  }

  /// Under m_: the found entries, each referenced once by the ticket.
  void stage(const std::vector<store_key>& keys, const std::vector<store_blob>& blobs,
             ticket_state& t) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (blobs[i].empty()) continue;
      ++c_.found;
      auto it = staged_.find(keys[i]);
      if (it == staged_.end()) {
        if (bytes_ + blobs[i].size() > opt_.max_staged_bytes) {
          ++c_.dropped;
          continue;
        }
        bytes_ += blobs[i].size();
        it = staged_.emplace(keys[i], staged_entry{blobs[i], 0}).first;
      }
      ++it->second.refs;
      t.staged.push_back(keys[i]);
    }
  }

  prefetch_options opt_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<job> q_;
  std::unordered_map<store_key, staged_entry, store_key_hasher> staged_;
  std::size_t bytes_ = 0;
  prefetch_counters c_;
  store_counters fetcher_c_;
  std::atomic<std::size_t> limit_{0};
  bool stopping_ = false;
  std::thread worker_;
};

template <class S>
class prefetch_core_of final : public prefetch_core {
 public:
  prefetch_core_of(S fetcher, prefetch_options o) : prefetch_core(o), s_(std::move(fetcher)) {}
  /// The worker calls into s_: it ends before s_ does.
  ~prefetch_core_of() override { stop(); }
  prefetch_core_of(const prefetch_core_of&) = delete;
  prefetch_core_of& operator=(const prefetch_core_of&) = delete;

 protected:
  store_status fetch(std::span<const store_key> keys, std::vector<store_blob>& out) override {
    return s_.get(keys, out);
  }
  void apply_limit(std::size_t n) override {
    if constexpr (requires { s_.limit_value_bytes(n); }) s_.limit_value_bytes(n);
  }
  store_counters fetch_counters() const override { return s_.counters(); }

 private:
  S s_;
};

}  // namespace detail

/// A prefetch under way or done. Its staged entries stay until it is destroyed: keep it until
/// the plan that reads them is made, then drop it. Dropped before its fetch ran, the fetch is
/// not made.
class prefetch_ticket {
 public:
  explicit prefetch_ticket(std::shared_ptr<detail::prefetch_core::ticket_state> s)
      : s_(std::move(s)) {}
  /// Waits for a callback running now; none runs afterwards.
  ~prefetch_ticket() {
    const std::lock_guard<std::mutex> g(s_->cb_m);
    s_->abandoned = true;
  }
  prefetch_ticket(const prefetch_ticket&) = delete;
  prefetch_ticket& operator=(const prefetch_ticket&) = delete;
  /// The fetch ran (or was given up: store down, adapter stopped); the plan may be made.
  [[nodiscard]] bool ready() const noexcept { return s_->ready.load(std::memory_order_acquire); }
  /// Entries it staged (found in the store and within the staging budget).
  [[nodiscard]] std::size_t staged() const noexcept { return ready() ? s_->staged.size() : 0; }

 private:
  std::shared_ptr<detail::prefetch_core::ticket_state> s_;
};

/// A handle on a prefetching_store's worker, for any thread; copies share it. It outlives the
/// store safely: prefetches after the store is gone are ready at once, with nothing staged.
class store_prefetcher {
 public:
  store_prefetcher() = default;
  explicit store_prefetcher(std::shared_ptr<detail::prefetch_core> c) : c_(std::move(c)) {}
  explicit operator bool() const noexcept { return c_ != nullptr; }

  /// Queues one batched get of `keys` on the worker. `on_ready` runs on the worker's thread
  /// once the ticket is ready, unless the ticket is ready at return (no keys, or the store is
  /// gone), which the caller sees by ready(), or was dropped first. It must not drop the
  /// ticket. Never blocks on the store.
  [[nodiscard]] std::unique_ptr<prefetch_ticket> prefetch(std::span<const store_key> keys,
                                                          std::function<void()> on_ready = {}) {
    if (!c_) {
      auto t = std::make_shared<detail::prefetch_core::ticket_state>();
      t->ready.store(true);
      return std::make_unique<prefetch_ticket>(std::move(t));
    }
    return std::make_unique<prefetch_ticket>(c_->prefetch(keys, std::move(on_ready)));
  }
  [[nodiscard]] prefetch_counters counters() const {
    return c_ ? c_->counters() : prefetch_counters{};
  }

 private:
  std::shared_ptr<detail::prefetch_core> c_;
};

/// @tparam S a kv_store. Two instances, one per thread, that must not share state (two
///         connections to one server, as write_behind's): `front` takes puts, contains and
///         erase on the caller's thread, `fetcher` is the worker's. A get never reaches either:
///         it answers from the staged entries, and a key nobody prefetched is a miss.
template <class S>
requires kv_store<S>
class prefetching_store {
 public:
  prefetching_store(S front, S fetcher, prefetch_options opt = {})
      : front_(std::move(front)),
        core_(std::make_shared<detail::prefetch_core_of<S>>(std::move(fetcher), opt)) {
    core_->start();
  }
  /// A moved-from prefetching_store is an unavailable store.
  prefetching_store(prefetching_store&&) noexcept = default;
  prefetching_store& operator=(prefetching_store&&) = delete;
  /// Stops the worker (a fetch under way finishes; queued ones are given up).
  ~prefetching_store() {
    if (core_) core_->stop();
  }

  /// A handle for prefetches from any thread.
  [[nodiscard]] store_prefetcher prefetcher() const { return store_prefetcher(core_); }

  store_status get(std::span<const store_key> keys, std::vector<store_blob>& out) {
    if (!core_) {
      out.assign(keys.size(), store_blob{});
      return store_status::kUnavailable;
    }
    core_->read(keys, out);
    return store_status::kOk;
  }
  store_status put(std::span<const store_key> keys,
                   std::span<const std::span<const std::byte>> values) {
    return core_ ? front_.put(keys, values) : store_status::kUnavailable;
  }
  store_status contains(std::span<const store_key> keys, std::vector<std::uint8_t>& out) {
    if (!core_) {
      out.assign(keys.size(), 0);
      return store_status::kUnavailable;
    }
    return front_.contains(keys, out);
  }
  store_status erase(std::span<const store_key> keys) {
    return core_ ? front_.erase(keys) : store_status::kUnavailable;
  }
  /// Both stores take the bound; the worker's from its next fetch.
  void limit_value_bytes(std::size_t n) {
    if constexpr (requires { front_.limit_value_bytes(n); }) front_.limit_value_bytes(n);
    if (core_) core_->limit_value_bytes(n);
  }
  /// The front store's counts, with reads (get calls, keys, found, bytes) as the worker made
  /// them and its failures added.
  [[nodiscard]] store_counters counters() const {
    if (!core_) return {};
    store_counters c = front_.counters();
    const store_counters f = core_->fetcher_counters();
    c.get_calls = f.get_calls;
    c.keys_requested = f.keys_requested;
    c.keys_found = f.keys_found;
    c.bytes_read = f.bytes_read;
    c.unavailable += f.unavailable;
    c.reconnects += f.reconnects;
    c.auth_failures += f.auth_failures;
    c.denied += f.denied;
    c.timeouts += f.timeouts;
    c.oversized += f.oversized;
    c.malformed += f.malformed;
    c.open_failures += f.open_failures;
    return c;
  }

 private:
  S front_;
  std::shared_ptr<detail::prefetch_core> core_;
};

static_assert(kv_store<prefetching_store<no_store>>, "prefetching_store must model kv_store");

RELOKV_NAMESPACE_END
