#include "lanes.hpp"

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "support/catch.hpp"

using relokv_engine::lanes;

TEST_CASE("lanes: each call runs both halves once, the second on the helper", "[engine]") {
  for (bool two : {true, false}) {
    INFO("two lanes " << two);
    lanes l(two);
    CHECK(l.two() == two);
    const auto caller = std::this_thread::get_id();
    std::vector<int> ran(2, 0);
    bool helper_elsewhere = true;
    for (int i = 0; i < 2000; ++i)
      l.run([&](int lane) {
        ++ran[static_cast<std::size_t>(lane)];
        if (lane == 1 && two)
          helper_elsewhere = helper_elsewhere && std::this_thread::get_id() != caller;
      });
    CHECK(ran[0] == 2000);
    CHECK(ran[1] == 2000);
    CHECK(helper_elsewhere);
  }
}

TEST_CASE("lanes: an exception in either lane reaches the caller after both finish", "[engine]") {
  lanes l(true);
  std::atomic<int> finished{0};
  CHECK_THROWS_WITH(l.run([&](int lane) {
    if (lane == 1) throw std::runtime_error("helper failed");
    ++finished;
  }),
                    "helper failed");
  CHECK(finished == 1);
  // The caller's own failure wins, and the helper's half still completes first.
  CHECK_THROWS_WITH(l.run([&](int lane) {
    if (lane == 0) throw std::runtime_error("caller failed");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ++finished;
  }),
                    "caller failed");
  CHECK(finished == 2);
  // The pair is usable afterwards.
  int sum = 0;
  l.run([&](int lane) {
    if (lane == 1) sum += 10;
  });
  l.run([&](int lane) {
    if (lane == 0) sum += 1;
  });
  CHECK(sum == 11);
}

TEST_CASE("lanes: callers on several threads take turns", "[engine]") {
  lanes l(true);
  std::atomic<long> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t)
    callers.emplace_back([&] {
      for (int i = 0; i < 300; ++i) l.run([&](int lane) { total += lane + 1; });
    });
  for (auto& c : callers) c.join();
  CHECK(total == 3 * 300 * 3);
}

TEST_CASE("lanes: the process-wide pair is one object", "[engine]") {
  CHECK(&lanes::get() == &lanes::get());
  int both = 0;
  lanes::get().run([&](int lane) {
    if (lane == 0) both += 1;
  });
  CHECK(both == 1);
}
