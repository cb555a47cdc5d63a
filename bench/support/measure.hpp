#pragma once
// Timing helpers for relokv_report: medians of repeated runs, and ratios measured side by side
// (the two sides alternate within each repetition, so machine noise hits both alike).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace relokv_bench {

/// Keeps the optimizer from discarding a value.
template <class T>
inline void keep(const T& v) {
  asm volatile("" : : "g"(&v) : "memory");
}

inline double now_ns() {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count());
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Median over `reps` repetitions of the time of `inner` calls of f, per call, in ns.
template <class F>
double median_ns(F&& f, int reps, int inner) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_ns();
    for (int i = 0; i < inner; ++i) f();
    t.push_back((now_ns() - t0) / inner);
  }
  return median(t);
}

/// Median of per-repetition ratios time(a) / time(b), a and b run back to back each time.
template <class A, class B>
double median_ratio(A&& a, B&& b, int reps, int inner) {
  std::vector<double> r;
  for (int k = 0; k < reps; ++k) {
    const double t0 = now_ns();
    for (int i = 0; i < inner; ++i) a();
    const double t1 = now_ns();
    for (int i = 0; i < inner; ++i) b();
    const double t2 = now_ns();
    r.push_back((t1 - t0) / (t2 - t1));
  }
  return median(r);
}

}  // namespace relokv_bench
