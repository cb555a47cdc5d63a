// relokv_server's Prometheus text (metrics.hpp).
#include "metrics.hpp"

#include <cstdio>

#include <relokv/store/block_format.hpp>

namespace relokv_server {

namespace {
std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
void header(std::string& out, const std::string& name, const std::string& help, const char* type) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}
void line(std::string& out, const std::string& name, double v) {
  out += name + " " + num(v) + "\n";
}
void counter(std::string& out, const std::string& name, const std::string& help, double v) {
  header(out, name, help, "counter");
  line(out, name, v);
}
void gauge(std::string& out, const std::string& name, const std::string& help, double v) {
  header(out, name, help, "gauge");
  line(out, name, v);
}
}  // namespace

histogram::histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}

void histogram::observe(double v) {
  for (std::size_t i = 0; i < bounds_.size(); ++i)
    if (v <= bounds_[i]) {
      ++counts_[i];
      break;
    }
  ++count_;
  sum_ += v;
}

void histogram::write(std::string& out, const std::string& name, const std::string& help) const {
  header(out, name, help, "histogram");
  std::int64_t cum = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  line(out, name + "_sum", sum_);
  out += name + "_count " + std::to_string(count_) + "\n";
}

metrics::metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      itl_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}) {}

void metrics::request_done(int status) {
  const std::lock_guard lock(mu_);
  ++requests_[status];
}
void metrics::ttft(double s) {
  const std::lock_guard lock(mu_);
  ttft_.observe(s);
}
void metrics::inter_token(double s) {
  const std::lock_guard lock(mu_);
  itl_.observe(s);
}
void metrics::prompt_tokens(std::int64_t computed, std::int64_t reused) {
  const std::lock_guard lock(mu_);
  computed_ += computed;
  reused_ += reused;
}
void metrics::completion_tokens(std::int64_t n) {
  const std::lock_guard lock(mu_);
  completion_ += n;
}
void metrics::preempted() {
  const std::lock_guard lock(mu_);
  ++preemptions_;
}
void metrics::span_compiled() {
  const std::lock_guard lock(mu_);
  ++spans_compiled_;
}
void metrics::span_wait() {
  const std::lock_guard lock(mu_);
  ++span_waits_;
}
void metrics::prefetch_wait() {
  const std::lock_guard lock(mu_);
  ++prefetch_waits_;
}
void metrics::escalated() {
  const std::lock_guard lock(mu_);
  ++escalations_;
}
void metrics::rejected(const std::string& reason) {
  const std::lock_guard lock(mu_);
  ++rejected_[reason];
}
void metrics::snapshot(const cache_snapshot& s) {
  const std::lock_guard lock(mu_);
  snap_ = s;
}
cache_snapshot metrics::last_snapshot() const {
  const std::lock_guard lock(mu_);
  return snap_;
}
std::int64_t metrics::preemptions() const {
  const std::lock_guard lock(mu_);
  return preemptions_;
}

std::string metrics::text() const {
  const std::lock_guard lock(mu_);
  std::string out;
  header(out, "relokv_requests_total", "Chat completion requests answered, by HTTP status.",
         "counter");
  for (const auto& [status, n] : requests_)
    out += "relokv_requests_total{status=\"" + std::to_string(status) + "\"} " + std::to_string(n) +
           "\n";
  header(out, "relokv_requests_rejected_total",
         "Requests refused before scheduling, by reason (queue_full, draining, invalid, ...).",
         "counter");
  for (const auto& [reason, n] : rejected_)
    out += "relokv_requests_rejected_total{reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
  ttft_.write(out, "relokv_time_to_first_token_seconds",
              "From the request's arrival to its first token.");
  itl_.write(out, "relokv_inter_token_latency_seconds", "Between two tokens of one request.");
  header(out, "relokv_prompt_tokens_total",
         "Prompt tokens, computed (at the first layer) or reused from the cache or store.",
         "counter");
  out += "relokv_prompt_tokens_total{kind=\"computed\"} " + std::to_string(computed_) + "\n";
  out += "relokv_prompt_tokens_total{kind=\"reused\"} " + std::to_string(reused_) + "\n";
  counter(out, "relokv_completion_tokens_total", "Tokens generated.", double(completion_));
  counter(out, "relokv_preemptions_total",
          "Sequences released for want of KV blocks and recomputed later.", double(preemptions_));
  counter(out, "relokv_escalations_total",
          "Requests recomputed in full before their first token by the escalation policy.",
          double(escalations_));
  counter(out, "relokv_spans_compiled_total",
          "Spans compiled alone before their request (--compile-spans alone).",
          double(spans_compiled_));
  counter(out, "relokv_span_waits_total",
          "Requests held back a step because a span of theirs was being computed by another "
          "request (they reuse it once its prompt is done).",
          double(span_waits_));
  counter(out, "relokv_store_prefetch_waits_total",
          "Requests that waited, while others ran, for the store entries their plan reads to be "
          "fetched off the scheduler's thread.",
          double(prefetch_waits_));
  gauge(out, "relokv_requests_running", "Sequences decoding.", double(snap_.running));
  gauge(out, "relokv_requests_prefilling", "Sequences whose prompt is being computed.",
        double(snap_.prefilling));
  gauge(out, "relokv_requests_waiting", "Requests queued for admission.", double(snap_.waiting));
  gauge(out, "relokv_kv_blocks_capacity", "KV blocks in the pool.", double(snap_.blocks_capacity));
  gauge(out, "relokv_kv_blocks_in_use", "KV blocks held by live sequences.",
        double(snap_.blocks_in_use));
  gauge(out, "relokv_kv_blocks_cached", "KV blocks registered for reuse.",
        double(snap_.blocks_cached));
  const relokv::cache_stats& s = snap_.stats;
  counter(out, "relokv_cache_evictions_total", "Cached blocks evicted for new ones.",
          double(s.evictions));
  header(out, "relokv_cache_blocks_total", "Prompt blocks planned, by how they were served.",
         "counter");
  out += "relokv_cache_blocks_total{kind=\"exact\"} " + std::to_string(s.exact_hits) + "\n";
  out += "relokv_cache_blocks_total{kind=\"relocated\"} " + std::to_string(s.relocated_hits) + "\n";
  out += "relokv_cache_blocks_total{kind=\"miss\"} " + std::to_string(s.misses) + "\n";
  counter(out, "relokv_cache_provenance_denied_total",
          "Relocated hits the provenance policy did not serve.", double(s.provenance_denied));
  counter(out, "relokv_store_hits_total", "Blocks fetched from the store and verified.",
          double(s.store_hits));
  counter(out, "relokv_store_misses_total", "Store lookups with no entry.", double(s.store_misses));
  counter(out, "relokv_store_unavailable_total", "Store calls not answered in their deadline.",
          double(s.store_unavailable));
  header(out, "relokv_store_rejections_total", "Fetched entries refused, by reason.", "counter");
  for (std::size_t i = 1; i < relokv::kBlockCheckCount; ++i)
    out += std::string("relokv_store_rejections_total{reason=\"") +
           relokv::to_string(static_cast<relokv::block_check>(i)) + "\"} " +
           std::to_string(s.store_rejected[i]) + "\n";
  counter(out, "relokv_store_writes_total", "Blocks handed to the store.", double(s.store_writes));
  counter(out, "relokv_store_write_failures_total", "Blocks a put did not store.",
          double(s.store_write_failures));
  return out;
}

}  // namespace relokv_server
