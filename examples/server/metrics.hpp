#pragma once
// relokv_server's counters in Prometheus' text exposition format (version 0.0.4): what a
// person running the service graphs and alerts on. Written by the serving loop and the HTTP
// threads, read by GET /metrics; one mutex, taken briefly.
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <relokv/cache/cache_stats.hpp>

namespace relokv_server {

/// A cumulative histogram with fixed upper bounds (seconds).
class histogram {
 public:
  explicit histogram(std::vector<double> bounds);
  void observe(double v);
  /// Appends the _bucket, _sum and _count lines of `name`.
  void write(std::string& out, const std::string& name, const std::string& help) const;
  [[nodiscard]] std::int64_t count() const noexcept { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<std::int64_t> counts_;  // per bound, not cumulative
  std::int64_t count_ = 0;
  double sum_ = 0;
};

/// The pool and cache as the serving loop last saw them.
struct cache_snapshot {
  std::int64_t blocks_capacity = 0, blocks_in_use = 0, blocks_cached = 0;
  std::int64_t running = 0, prefilling = 0, waiting = 0;
  relokv::cache_stats stats;
};

class metrics {
 public:
  metrics();
  void request_done(int status);
  void ttft(double seconds);
  void inter_token(double seconds);
  void prompt_tokens(std::int64_t computed, std::int64_t reused);
  void completion_tokens(std::int64_t n);
  void preempted();
  void span_compiled();  ///< a span compiled alone (--compile-spans alone)
  /// A request held back a step: a span of its prompt was being computed by another request.
  void span_wait();
  /// A request held back until the store entries its plan reads were fetched off the
  /// serving loop's thread (a store that prefetches: redis, redis-cluster, file).
  void prefetch_wait();
  void escalated();  ///< a request recomputed in full by the escalation policy
  void rejected(const std::string& reason);  ///< refused before scheduling: queue_full, ...
  void snapshot(const cache_snapshot& s);
  [[nodiscard]] cache_snapshot last_snapshot() const;
  [[nodiscard]] std::int64_t preemptions() const;
  /// The exposition text.
  [[nodiscard]] std::string text() const;

 private:
  mutable std::mutex mu_;
  std::map<int, std::int64_t> requests_;
  std::map<std::string, std::int64_t> rejected_;
  histogram ttft_, itl_;
  std::int64_t computed_ = 0, reused_ = 0, completion_ = 0, preemptions_ = 0, escalations_ = 0,
               spans_compiled_ = 0, span_waits_ = 0, prefetch_waits_ = 0;
  cache_snapshot snap_;
};

}  // namespace relokv_server
