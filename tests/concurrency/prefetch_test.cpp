// prefetching_store and relocatable_cache::store_keys: a request's store reads made on a worker
// thread while it waits, so that its plan finds them staged and the owner thread never waits
// for the store. Run under ThreadSanitizer in CI (label threads): the staged entries, the
// queue, the tickets and the counters are the shared state.
#include <relokv/recompute/first_k.hpp>
#include <relokv/store/file_store.hpp>
#include <relokv/store/prefetching_store.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "support/catch.hpp"
#include "support/store_fixture.hpp"

using namespace relokv_test::store_fixture;
using relokv::store_key;

namespace {

/// A directory of its own for one test case, removed after it.
struct temp_dir {
  std::filesystem::path path;
  explicit temp_dir(const char* name)
      : path(std::filesystem::temp_directory_path() /
             (std::string("relokv_prefetch_") + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
};

/// A store over another whose gets take `delay` (a distant or loaded server), which records
/// the keys it was asked for, and which can be made to answer kUnavailable (a server down).
template <class S>
struct probe_store {
  struct log {
    std::mutex m;
    std::vector<store_key> asked;
    std::atomic<int> gets{0};
  };
  S inner;
  std::chrono::milliseconds delay{0};
  bool down = false;
  std::shared_ptr<log> seen = std::make_shared<log>();

  relokv::store_status get(std::span<const store_key> k, std::vector<relokv::store_blob>& o) {
    std::this_thread::sleep_for(delay);
    ++seen->gets;
    {
      const std::lock_guard lk(seen->m);
      seen->asked.insert(seen->asked.end(), k.begin(), k.end());
    }
    if (down) {
      o.assign(k.size(), {});
      return relokv::store_status::kUnavailable;
    }
    return inner.get(k, o);
  }
  relokv::store_status put(std::span<const store_key> k,
                           std::span<const std::span<const std::byte>> v) {
    return inner.put(k, v);
  }
  relokv::store_status contains(std::span<const store_key> k, std::vector<std::uint8_t>& o) {
    return inner.contains(k, o);
  }
  relokv::store_status erase(std::span<const store_key> k) { return inner.erase(k); }
  [[nodiscard]] relokv::store_counters counters() const { return inner.counters(); }
  std::vector<store_key> asked() const {
    const std::lock_guard lk(seen->m);
    return seen->asked;
  }
};
using probe = probe_store<relokv::file_store>;
using prefetching = relokv::prefetching_store<probe>;

bool same_set(std::vector<store_key> a, std::vector<store_key> b) {
  const auto less = [](const store_key& x, const store_key& y) {
    return x.hi != y.hi ? x.hi < y.hi : x.lo < y.lo;
  };
  std::sort(a.begin(), a.end(), less);
  std::sort(b.begin(), b.end(), less);
  return a == b;
}

/// Waits (at most 10 s) for a ticket.
bool wait_ready(const relokv::prefetch_ticket& t) {
  for (int i = 0; i < 2000 && !t.ready(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return t.ready();
}

/// Fills `dir` with the blocks of sys + A + B (sys x2, A x2, B x2: six entries).
void fill(const std::filesystem::path& dir) {
  instance<relokv::file_store> w{relokv::file_store(dir)};
  (void)w.serve(rag({&kA, &kB}));
  REQUIRE(w.cache.stats().store_writes == 6);
}

/// A cache over a prefetching_store on `dir` whose worker reads through `fetcher`, its
/// prefetcher, and the keys a plan of `layout` would look up now.
struct staged_cache {
  relokv::store_prefetcher pre;
  instance<prefetching> r;
  std::vector<store_key> keys;
  staged_cache(const std::filesystem::path& dir, probe fetcher,
               const relokv::request_layout& layout, relokv::prefetch_options opt = {})
      : staged_cache(prefetching(probe{relokv::file_store(dir)}, std::move(fetcher), opt), layout) {
  }

 private:
  staged_cache(prefetching st, const relokv::request_layout& layout)
      : pre(st.prefetcher()), r{std::move(st)} {
    r.cache.store_keys(layout, relokv::recompute::none{}, {}, keys);
  }
};

}  // namespace

TEST_CASE("store_keys: exactly the entries the plan would look up, touching nothing",
          "[threads][store][prefetch]") {
  const temp_dir dir("keys");
  fill(dir.path);
  probe st{relokv::file_store(dir.path)};
  const auto seen = st.seen;
  instance<probe> r{st};
  const auto layout = rag({&kB, &kA});
  std::vector<store_key> keys;
  r.cache.store_keys(layout, relokv::recompute::none{}, {}, keys);
  CHECK(keys.size() == 6);
  const auto stats_before = r.cache.stats();
  CHECK(seen->gets == 0);  // store_keys reads no store
  CHECK(r.cache.live_requests() == 0);
  auto p = r.serve(layout);
  CHECK(p.store_hits == 6);
  CHECK(same_set(keys, r.cache.store().asked()));
  CHECK(stats_before.store_lookups == 0);

  // Now the pool holds every block: nothing to fetch.
  r.cache.store_keys(layout, relokv::recompute::none{}, {}, keys);
  CHECK(keys.empty());
  // A new span behind them: only its blocks (it is not in the store either: looked up all the
  // same, as the plan does).
  const auto kC = seq(5000, 32);
  r.cache.store_keys(rag({&kA, &kB, &kC}), relokv::recompute::none{}, {}, keys);
  CHECK(keys.size() == 2);
  // The tenant's keys are part of a store key: another tenant's keys differ.
  std::vector<store_key> mine, theirs;
  instance<probe> fresh{probe{relokv::file_store(dir.path)}};
  fresh.cache.store_keys(layout, relokv::recompute::none{}, {}, mine);
  relokv::extra_keys x;
  x.tenant_salt = 7;
  fresh.cache.store_keys(layout, relokv::recompute::none{}, x, theirs);
  REQUIRE(mine.size() == theirs.size());
  CHECK_FALSE(same_set(mine, theirs));
}

TEST_CASE("store_keys: a strategy's whole-block recompute is not fetched, as in the plan",
          "[threads][store][prefetch]") {
  const temp_dir dir("epic");
  fill(dir.path);
  // EPIC with k = 16 recomputes the first block of every span whole: plan fetches 4 of 6.
  using epic_instance =
      instance<probe, relokv::xxh3_128, relokv::at_attention, relokv::recompute::first_k>;
  epic_instance r{probe{relokv::file_store(dir.path)}, kFp, relokv::recompute::first_k{16}};
  const auto layout = rag({&kB, &kA});
  std::vector<store_key> keys;
  r.cache.store_keys(layout, relokv::recompute::first_k{16}, {}, keys);
  CHECK(keys.size() == 4);
  (void)r.serve(layout);
  CHECK(same_set(keys, r.cache.store().asked()));
}

TEST_CASE("store_keys: no store, reads off, or a bad layout", "[threads][store][prefetch]") {
  instance<relokv::no_store> none{relokv::no_store{}};
  std::vector<store_key> keys{{1, 2}};
  none.cache.store_keys(rag({&kA}), relokv::recompute::none{}, {}, keys);
  CHECK(keys.empty());
  auto bad = rag({&kA});
  bad.block_size = 32;
  CHECK_THROWS_WITH(none.cache.store_keys(bad, relokv::recompute::none{}, {}, keys),
                    Catch::Contains("block_size"));
  auto broken = rag({&kA});
  broken.blocks[1].pos0 += 1;
  CHECK_THROWS_AS(none.cache.store_keys(broken, relokv::recompute::none{}, {}, keys),
                  relokv::layout_error);
}

TEST_CASE("prefetching_store: a plan finds prefetched entries staged, the rest are misses",
          "[threads][store][prefetch]") {
  const temp_dir dir("staged");
  fill(dir.path);
  probe fetcher{relokv::file_store(dir.path)};
  const auto fetched = fetcher.seen;
  const auto layout = rag({&kB, &kA});
  staged_cache sc(dir.path, fetcher, layout);
  auto& [pre, r, keys] = sc;

  // Nobody prefetched: the plan reads no store and computes everything.
  auto p0 = r.serve(layout, /*commit=*/false);
  CHECK(p0.store_hits == 0);
  CHECK(fetched->gets == 0);
  CHECK(pre.counters().unstaged == 6);

  REQUIRE(keys.size() == 6);
  std::atomic<int> called{0};
  auto t = pre.prefetch(keys, [&] { ++called; });
  REQUIRE(wait_ready(*t));
  CHECK(t->staged() == 6);
  CHECK(fetched->gets == 1);  // one batched get
  auto p = r.serve(layout);   // serve checks every slot's K and V
  CHECK(p.store_hits == 6);
  CHECK(count_tier(p, block_tier::kStore) == 6);
  const auto c = pre.counters();
  CHECK(c.requests == 1);
  CHECK(c.found == 6);
  CHECK(c.served == 6);
  CHECK(c.staged_entries == 6);  // held until the ticket goes
  t.reset();
  CHECK(pre.counters().staged_entries == 0);
  CHECK(pre.counters().staged_bytes == 0);
  for (int i = 0; i < 200 && called.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(called.load() == 1);
  // The adapter reports the worker's reads as the store's.
  CHECK(r.cache.store().counters().get_calls == 1);
  CHECK(r.cache.store().counters().keys_found == 6);
}

TEST_CASE("prefetching_store: a slow store never holds the owner thread",
          "[threads][store][prefetch]") {
  const temp_dir dir("slow");
  fill(dir.path);
  probe fetcher{relokv::file_store(dir.path)};
  fetcher.delay = std::chrono::milliseconds(400);
  const auto layout = rag({&kB, &kA});
  staged_cache sc(dir.path, fetcher, layout);
  auto& [pre, r, keys] = sc;

  const auto t0 = std::chrono::steady_clock::now();
  auto first = pre.prefetch(keys);
  auto second = pre.prefetch(keys);  // queued behind the first
  CHECK_FALSE(first->ready());
  // The owner plans another request meanwhile: its lookups are misses, never a wait.
  const auto other = rag({&kA});
  auto p = r.serve(other, /*commit=*/false);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK(ms < 300);  // the fetch takes 400 ms
  CHECK(p.store_hits == 0);
  second.reset();  // its request went away before its fetch: not made
  REQUIRE(wait_ready(*first));
  CHECK(first->staged() == 6);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(pre.counters().cancelled == 1);
  CHECK(r.serve(layout).store_hits == 6);
}

TEST_CASE("prefetching_store: a store down, a full staging budget, the adapter gone",
          "[threads][store][prefetch]") {
  const temp_dir dir("faults");
  fill(dir.path);
  const auto layout = rag({&kB, &kA});
  SECTION("down: ready with nothing staged; the request computes") {
    probe fetcher{relokv::file_store(dir.path)};
    fetcher.down = true;
    staged_cache sc(dir.path, fetcher, layout);
    auto& [pre, r, keys] = sc;
    auto t = pre.prefetch(keys);
    REQUIRE(wait_ready(*t));
    CHECK(t->staged() == 0);
    CHECK(r.serve(layout).store_hits == 0);
  }
  SECTION("budget: what does not fit is dropped, counted, and computed") {
    relokv::prefetch_options opt;
    opt.max_staged_bytes = 1;  // not one entry fits
    staged_cache sc(dir.path, probe{relokv::file_store(dir.path)}, layout, opt);
    auto& [pre, r, keys] = sc;
    auto t = pre.prefetch(keys);
    REQUIRE(wait_ready(*t));
    CHECK(pre.counters().dropped == 6);
    CHECK(pre.counters().staged_bytes == 0);
    CHECK(r.serve(layout).store_hits == 0);
  }
  SECTION("gone: queued fetches are given up, their waiters told; later ones ready at once") {
    probe slow{relokv::file_store(dir.path)};
    slow.delay = std::chrono::milliseconds(200);
    std::atomic<int> called{0};
    relokv::store_prefetcher pre;
    std::unique_ptr<relokv::prefetch_ticket> a, b;
    {
      prefetching st(probe{relokv::file_store(dir.path)}, slow);
      pre = st.prefetcher();
      const store_key k{1, 2};
      a = pre.prefetch({&k, 1}, [&] { ++called; });
      b = pre.prefetch({&k, 1}, [&] { ++called; });
    }  // the first fetch finishes; the second is given up
    CHECK(a->ready());
    CHECK(b->ready());
    CHECK(called.load() == 2);
    const store_key k{3, 4};
    auto late = pre.prefetch({&k, 1}, [&] { ++called; });
    CHECK(late->ready());
    CHECK(called.load() == 2);
    CHECK(relokv::store_prefetcher().prefetch({&k, 1})->ready());
  }
  SECTION("dropped during its fetch: its callback never runs, its entries are not kept") {
    probe slow{relokv::file_store(dir.path)};
    slow.delay = std::chrono::milliseconds(150);
    staged_cache sc(dir.path, slow, layout);
    auto& [pre, r, keys] = sc;
    std::atomic<int> called{0};
    auto t = pre.prefetch(keys, [&] { ++called; });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the fetch is under way
    t.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(called.load() == 0);
    CHECK(pre.counters().staged_entries == 0);
    CHECK(r.serve(layout).store_hits == 0);
  }
  SECTION("moved from: an unavailable store") {
    prefetching a(probe{relokv::file_store(dir.path)}, probe{relokv::file_store(dir.path)});
    prefetching b(std::move(a));
    const store_key k{1, 2};
    std::vector<relokv::store_blob> got;
    std::vector<std::uint8_t> has;
    CHECK(a.get({&k, 1}, got) == relokv::store_status::kUnavailable);
    CHECK(got.size() == 1);
    CHECK(a.contains({&k, 1}, has) == relokv::store_status::kUnavailable);
    CHECK(a.erase({&k, 1}) == relokv::store_status::kUnavailable);
    CHECK(a.counters().get_calls == 0);
    CHECK_FALSE(a.prefetcher());
    CHECK(b.get({&k, 1}, got) == relokv::store_status::kOk);
  }
}
