#pragma once
// The reference engine's two lanes of work: the calling thread and one persistent helper.
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace relokv_engine {

/// Two lanes of work, the calling thread and one persistent helper, between which the engine
/// splits its GEMMs and its prefill attention. (The engine's products are its own, sgemm.hpp
/// and qgemm.hpp: no library thread pool competes with the lanes.)
class lanes {
 public:
  /// The process-wide pair: two lanes when the machine has two cores, else one that runs both
  /// halves in turn. Never destroyed, so that no exit-time destructor races the helper.
  static lanes& get();

  /// A pair of its own (tests); `two` false runs both halves on the caller.
  explicit lanes(bool two);
  ~lanes();
  lanes(const lanes&) = delete;
  lanes& operator=(const lanes&) = delete;

  /// Runs f(0) on the calling thread and f(1) on the helper, returns when both are done, and
  /// rethrows an exception of either (the caller's first). Callers on several threads take
  /// turns; f must not call run() on the same pair.
  void run(const std::function<void(int)>& f);

  bool two() const noexcept { return two_; }

 private:
  void loop();

  const bool two_;
  std::mutex turn_, m_;
  std::condition_variable cv_;
  std::atomic<unsigned> gen_{0}, done_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int)>* task_ = nullptr;
  std::exception_ptr error_;
  std::thread helper_;
};

}  // namespace relokv_engine
