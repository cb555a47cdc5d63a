// The engine's two lanes (see lanes.hpp).
#include "lanes.hpp"

namespace relokv_engine {
namespace {

void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

constexpr int kSpin = 1 << 16;  // pauses before the helper sleeps or the caller yields

}  // namespace

lanes& lanes::get() {
  static lanes* const l = new lanes(std::thread::hardware_concurrency() >= 2);
  return *l;
}

lanes::lanes(bool two) : two_(two) {
  if (two_) helper_ = std::thread([this] { loop(); });
}

lanes::~lanes() {
  if (!helper_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_.store(true, std::memory_order_release);
  }
  cv_.notify_one();
  helper_.join();
}

void lanes::run(const std::function<void(int)>& f) {
  if (!two_) {
    f(0);
    f(1);
    return;
  }
  std::lock_guard<std::mutex> turn(turn_);
  {
    std::lock_guard<std::mutex> lk(m_);
    task_ = &f;
    error_ = nullptr;
    gen_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_one();
  std::exception_ptr mine;
  try {
    f(0);
  } catch (...) {
    mine = std::current_exception();
  }
  const unsigned want = gen_.load(std::memory_order_relaxed);
  for (int spin = 0; done_.load(std::memory_order_acquire) != want; ++spin)
    spin < kSpin ? relax() : std::this_thread::yield();
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void lanes::loop() {
  unsigned seen = 0;
  for (;;) {
    // Spin briefly (the next GEMM usually follows within microseconds), then sleep.
    for (int spin = 0; spin < kSpin && gen_.load(std::memory_order_acquire) == seen &&
                       !stop_.load(std::memory_order_acquire);
         ++spin)
      relax();
    {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] {
        return gen_.load(std::memory_order_acquire) != seen ||
               stop_.load(std::memory_order_acquire);
      });
      if (gen_.load(std::memory_order_acquire) == seen) return;  // stopped with no work
    }
    seen = gen_.load(std::memory_order_acquire);
    try {
      (*task_)(1);
    } catch (...) {
      error_ = std::current_exception();
    }
    done_.store(seen, std::memory_order_release);
  }
}

}  // namespace relokv_engine
