// write_behind: commit hands blocks to a queue and returns; a worker thread writes them. Run
// under ThreadSanitizer in CI (label threads): the queue, the counters and the worker's store
// are the shared state.
#include <relokv/store/file_store.hpp>
#include <relokv/store/write_behind.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "support/catch.hpp"
#include "support/store_fixture.hpp"

using namespace relokv_test::store_fixture;

namespace {
/// A store whose puts take 50 ms, as a distant or loaded server's would.
struct slow_store {
  std::shared_ptr<std::atomic<std::int64_t>> written =
      std::make_shared<std::atomic<std::int64_t>>(0);
  relokv::store_status get(std::span<const relokv::store_key> k,
                           std::vector<relokv::store_blob>& o) {
    o.assign(k.size(), {});
    return relokv::store_status::kOk;
  }
  relokv::store_status put(std::span<const relokv::store_key> k,
                           std::span<const std::span<const std::byte>>) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    *written += static_cast<std::int64_t>(k.size());
    return relokv::store_status::kOk;
  }
  relokv::store_status contains(std::span<const relokv::store_key> k,
                                std::vector<std::uint8_t>& o) {
    o.assign(k.size(), 0);
    return relokv::store_status::kOk;
  }
  relokv::store_status erase(std::span<const relokv::store_key>) {
    return relokv::store_status::kOk;
  }
  [[nodiscard]] relokv::store_counters counters() const noexcept {
    relokv::store_counters c;
    c.keys_written = written->load();
    return c;
  }
};
}  // namespace

TEST_CASE("write_behind: commit returns at once; the worker writes behind", "[threads][store]") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("relokv_write_behind_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  {
    using wb = relokv::write_behind<relokv::file_store>;
    instance<wb> w{wb(relokv::file_store(dir), relokv::file_store(dir))};
    for (const auto* d : {&kA, &kB}) (void)w.serve(rag({d}));
    w.cache.store().flush();
    CHECK(w.cache.store().counters().keys_written == 6);  // sys x2, A x2, B x2
    CHECK(w.cache.stats().store_writes == 6);  // the second request found the prefix pooled
    instance<relokv::file_store> r{relokv::file_store(dir)};
    CHECK(r.serve(rag({&kB, &kA})).store_hits == 6);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("write_behind: a slow store never slows commit; a full queue drops", "[threads][store]") {
  slow_store back;
  const auto written = back.written;
  relokv::write_behind_options opt;
  opt.max_queued_bytes = 3 * 5000;  // about three small blocks
  opt.batch = 2;
  using wb = relokv::write_behind<slow_store>;
  std::int64_t handed = 0, failed = 0;
  {
    instance<wb> w{wb(slow_store{}, back, opt)};
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::vector<token_t>> spans;
    for (int i = 0; i < 12; ++i) spans.push_back(seq(20000 + 100 * i, 32));
    for (const auto& sp : spans) (void)w.serve(rag({&sp}));
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    CHECK(ms < 500);  // 12 requests; writing them through would take >= 600 ms
    handed = w.cache.stats().store_writes;
    failed = w.cache.stats().store_write_failures;
    CHECK(failed > 0);  // the queue was full
    CHECK(w.cache.store().counters().put_rejected == failed);
  }  // the destructor drains the queue
  CHECK(written->load() == handed);
  CHECK(handed + failed == 12 * 2 + 2);  // each span's two blocks, the prefix once
}

TEST_CASE("write_behind: a moved-from adapter is an unavailable store", "[threads][store]") {
  using wb = relokv::write_behind<slow_store>;
  slow_store s;
  wb a(s, s);
  wb b(std::move(a));
  const relokv::store_key key{1, 2};
  const std::byte bytes[4] = {};
  const std::span<const std::byte> value(bytes);
  std::vector<relokv::store_blob> got;
  std::vector<std::uint8_t> has;
  // The moved-from one answers, touching nothing that moved away.
  CHECK(a.put({&key, 1}, {&value, 1}) == relokv::store_status::kUnavailable);
  CHECK(a.get({&key, 1}, got) == relokv::store_status::kUnavailable);
  CHECK(a.contains({&key, 1}, has) == relokv::store_status::kUnavailable);
  CHECK(a.erase({&key, 1}) == relokv::store_status::kUnavailable);
  CHECK(a.counters().put_calls == 0);
  CHECK(a.queued().first == 0);
  a.flush();
  // The moved-to one works.
  CHECK(b.put({&key, 1}, {&value, 1}) == relokv::store_status::kOk);
  b.flush();
  CHECK(b.counters().keys_written == 1);
}
