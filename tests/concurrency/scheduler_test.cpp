// The concurrency contract (README, "Threads"): a relocatable_cache is owned by one scheduler
// thread; engines attend and write KV on other threads. Run under ThreadSanitizer in CI
// (scripts/test --tsan), where a block handed to a new request while a worker still reads it
// (or any hidden shared state) shows up as a data race.
#include <relokv/attention/host_attention.hpp>
#include <relokv/attention/kv_append.hpp>
#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/rope/at_attention.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "support/catch.hpp"

using relokv::token_t;

namespace {

constexpr int kBlock = 8, kDim = 16, kHeads = 2;

/// Deterministic K/V of a token at a position (what a model would compute).
void token_kv(token_t t, int pos, float* k, float* v) {
  for (int h = 0; h < kHeads; ++h)
    for (int d = 0; d < kDim; ++d) {
      k[h * kDim + d] = 0.01f * static_cast<float>((t * 31 + d * 7 + h) % 97);
      v[h * kDim + d] = 0.01f * static_cast<float>((t * 17 + d + pos % 5) % 89);
    }
}

struct job {
  std::vector<relokv::block_entry> table;
  relokv::pos_t query_pos = 0;
  relokv::request_id id = 0;
};

/// A queue between the scheduler and the workers.
template <class T>
class channel {
 public:
  void push(T v) {
    {
      std::lock_guard lock(m_);
      q_.push_back(std::move(v));
    }
    cv_.notify_one();
  }
  bool pop(T& v) {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return !q_.empty() || closed_; });
    if (q_.empty()) return false;
    v = std::move(q_.front());
    q_.pop_front();
    return true;
  }
  void close() {
    {
      std::lock_guard lock(m_);
      closed_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<T> q_;
  bool closed_ = false;
};

}  // namespace

TEST_CASE("threads: the scheduler plans and writes while workers attend over live plans",
          "[threads]") {
  relokv::rope_config cfg;
  cfg.head_dim = cfg.rotary_dim = kDim;
  const relokv::rope_table rope(cfg, 4096);
  relokv::host_kv_storage<float> kv(relokv::kv_shape{1, 48, kHeads, kBlock, kDim});
  relokv::relocatable_cache<> cache(relokv::lru_block_pool(48), kBlock);  // scheduler-owned

  channel<job> work;
  channel<relokv::request_id> done;
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w)
    workers.emplace_back([&] {
      std::vector<float> q(2 * kHeads * kDim, 0.1f), out(q.size());
      job j;
      while (work.pop(j)) {
        const std::int32_t indptr[2] = {0, static_cast<std::int32_t>(j.table.size())};
        relokv::decode_attention<relokv::at_attention>(rope, kv.layer(0),
                                                       {j.table.data(), indptr, 1}, q.data(),
                                                       &j.query_pos, 2 * kHeads, 0.25f, out.data());
        done.push(j.id);
      }
    });

  std::mt19937 rng(5);
  std::vector<std::vector<token_t>> docs;
  for (int d = 0; d < 6; ++d) {
    std::vector<token_t> t(static_cast<std::size_t>(10 + 3 * d));
    for (auto& x : t) x = static_cast<token_t>(rng() % 1000);
    docs.push_back(t);
  }
  const std::vector<token_t> sys = {1, 2, 3, 4, 5};
  int in_flight = 0, planned = 0, hits = 0;
  relokv::request_id finished = 0;
  for (int r = 0; r < 300; ++r) {
    relokv::layout_builder b(kBlock);
    b.prefix(sys);
    for (int k = 0; k < 2; ++k) b.span(docs[rng() % docs.size()]);
    const auto layout = b.build();
    auto plan = cache.plan(layout);
    while (!plan.ok() && in_flight > 0) {  // wait for a worker, release, retry
      REQUIRE(done.pop(finished));
      cache.release(finished);
      --in_flight;
      plan = cache.plan(layout);
    }
    REQUIRE(plan.ok());
    ++planned;
    hits += plan.exact_hits + plan.relocated_hits;
    // The scheduler writes the request's new blocks while workers read older, live ones.
    for (const auto& pb : plan.blocks)
      for (int j = 0; j < pb.len; ++j) {
        const int pos = pb.pos0 + j;
        if (!plan.compute[static_cast<std::size_t>(pos)]) continue;
        float k[kHeads * kDim], v[kHeads * kDim];
        token_kv(layout.tokens[static_cast<std::size_t>(pos)], pos, k, v);
        relokv::append_kv<relokv::at_attention>(rope, kv.layer(0), pb.physical, j, pos, k, v);
      }
    cache.commit(plan.id);
    work.push({plan.block_table(), layout.num_tokens(), plan.id});
    ++in_flight;
  }
  work.close();
  for (auto& t : workers) t.join();
  while (in_flight-- > 0) {
    REQUIRE(done.pop(finished));
    cache.release(finished);
  }
  CHECK(cache.live_requests() == 0);
  CHECK(planned == 300);
  CHECK(hits > 100);
}

TEST_CASE("threads: caches on different threads share nothing", "[threads]") {
  auto run = [](std::uint32_t seed, std::int64_t& hits) {
    relokv::relocatable_cache<> cache(relokv::lru_block_pool(64), 16);
    std::mt19937 rng(seed);
    const std::vector<token_t> sys = {1, 2, 3};
    for (int r = 0; r < 200; ++r) {
      std::vector<token_t> doc(static_cast<std::size_t>(20 + rng() % 20));
      for (auto& x : doc) x = static_cast<token_t>(rng() % 8);
      auto p = cache.plan(relokv::layout_builder(16).prefix(sys).span(doc).build());
      if (!p.ok()) continue;
      cache.commit(p.id);
      cache.release(p.id);
    }
    hits = cache.stats().exact_hits + cache.stats().relocated_hits;
  };
  std::int64_t a = 0, b = 0, c = 0;
  std::thread t1([&] { run(1, a); });
  std::thread t2([&] { run(1, b); });
  run(2, c);
  t1.join();
  t2.join();
  CHECK(a == b);  // the same sequence gives the same result whatever runs beside it
}
