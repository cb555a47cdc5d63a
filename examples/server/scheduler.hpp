#pragma once
// relokv_server's scheduler: one thread owns the engine and its relocatable_cache (plan,
// commit, release, extend), as relokv's threading contract says; HTTP threads hand it jobs
// and read what it publishes. Continuous batching: every step computes one prefill chunk of
// at most `prefill_chunk` rows and one decode token of every running sequence, in two
// forwards (the prefill rows on the int16 tiles, the decode rows batched on the int8 kernels:
// a row takes the kernel it would take alone; docs/server.md), so a long prompt delays decode
// by one chunk at a time. Out of blocks: admission waits; a decode that cannot extend preempts the
// youngest sequence (its blocks committed and released; it is recomputed later, its answer so far
// continuing its question).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <relokv/recompute/any_strategy.hpp>
#include <relokv/recompute/escalation.hpp>
#include <relokv/recompute/full.hpp>
#include <relokv/rope/block_relative.hpp>

#include "api.hpp"
#include "llama.hpp"
#include "metrics.hpp"
#include "serving_engine.hpp"
#include "tokenizer.hpp"

namespace relokv_server {

using clock_type = std::chrono::steady_clock;

/// One chat completion between an HTTP thread and the scheduler. The HTTP thread fills the
/// request part and waits on `cv`; the scheduler publishes text (whole UTF-8 characters, never
/// a prefix of a stop sequence) and, at the end, the finish reason and usage.
struct job {
  // Set by the HTTP thread before submit(), read-only afterwards.
  std::string id;
  chat_request req;
  built_prompt prompt;
  relokv::recompute::any_strategy strategy;
  std::string strategy_name;
  /// Recompute in full, before the first token, when the first distribution looks unsure
  /// (relokv/recompute/escalation.hpp; @first policies only): `full_prompt` is then served
  /// with full recompute.
  relokv::recompute::escalation_policy escalation;
  built_prompt full_prompt;
  relokv::extra_keys keys;
  std::uint64_t principal = 0;
  clock_type::time_point arrived = clock_type::now();
  /// Set by the HTTP thread when its client went away: the scheduler releases the sequence
  /// (scheduler::wake() makes it look now).
  std::atomic<bool> cancelled{false};
  /// Called by the scheduler, without any lock held, after each publish (text, the end, an
  /// error): the HTTP layer's cue to read what changed. Set before submit(), then read-only.
  std::function<void()> on_update;

  // Published by the scheduler under mu.
  std::mutex mu;
  std::condition_variable cv;
  std::string text;  ///< the answer so far
  bool done = false;
  std::string finish_reason;  ///< stop, length, or empty with an error
  int error_status = 0;       ///< a failure: its HTTP status; error_message says why
  std::string error_message;
  std::int32_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  std::int32_t computed_tokens = 0;  ///< prompt tokens computed at the first layer
  std::int32_t compiled_tokens = 0;  ///< --compile-spans alone: span tokens compiled for it
  double work = 0;                   ///< prefill work as a fraction of full recompute's
  std::int32_t preemptions = 0;
  bool escalated = false;  ///< recomputed in full by the escalation policy
};

class scheduler {
 public:
  struct options {
    std::int32_t max_running = 16;     ///< sequences live at once (the batch)
    std::int32_t max_queue = 64;       ///< jobs waiting for admission; beyond: 503
    std::int32_t prefill_chunk = 256;  ///< prompt rows of one sequence per step, at most
    /// Rows a step computes: one per running sequence's next token, the rest prompt chunks of
    /// as many prefilling sequences as fit (the first of them always moves).
    std::int32_t step_tokens = 512;
    /// --compile-spans alone: a request's spans are compiled alone behind its prefix before it
    /// opens (as span-link adapters were trained); false: a span first seen is computed in
    /// the request that shows it, in its context.
    bool compile_alone = false;
    /// --schedule least-work (true): each step's prompt rows go first to the prefilling
    /// sequences with the fewest rows left to compute (a follow-up turn, a prompt mostly
    /// reused), as SGLang's longest-prefix-match order; one passed over kStarveSteps steps in
    /// a row goes first from then on, in admission order, so none waits forever. false
    /// (fcfs, the default): in admission order.
    bool least_work_first = false;
  };
  /// Steps a prefilling sequence may be passed over before it goes first (least_work_first).
  static constexpr std::int32_t kStarveSteps = 8;
  scheduler(serving_engine& eng, const relokv_engine::tokenizer& tok, metrics& m, options o);
  ~scheduler();
  scheduler(const scheduler&) = delete;
  scheduler& operator=(const scheduler&) = delete;

  /// Queues a job. False when the queue is full or the scheduler stops (answer 503).
  bool submit(std::shared_ptr<job> j);
  /// Jobs queued or live: exact, each counted from submit() to its one finish or failure.
  [[nodiscard]] std::int32_t in_flight() const;
  /// Makes the scheduler thread look at its jobs now (a job was cancelled).
  void wake();
  /// Ends every job it has (queued, prefilling, running) with an error of `status` at the next
  /// step, and refuses new ones: a drain that ran out of time.
  void cancel_all(int status, const std::string& message);
  /// Finishes every job it has, then stops the thread.
  void stop();

 private:
  struct seq_state;
  void loop();
  void step(std::vector<std::shared_ptr<job>>& incoming);
  void admit();
  /// --compile-spans alone: the request's spans compiled alone (and committed) before it
  /// opens; returns the token-layers computed. Stops at the first that cannot open.
  std::int64_t compile_alone(const built_prompt& p, const job& j);
  /// The prefilling sequences' prompt chunks within the step's budget.
  void prefill_some();
  /// A chunk of prefilling_[i]'s prompt; true when it left prefilling_ (its first token
  /// sampled, or sent back to wait for full recompute).
  bool prefill_one(std::size_t i, std::int32_t rows);
  void decode_all();
  void on_token(seq_state& s, relokv::token_t t);
  /// `text`: the answer so far, decoded once per token by the caller.
  void publish(seq_state& s, const std::string& text, bool final);
  void finish(seq_state& s, const std::string& reason);
  void fail(seq_state& s, int status, const std::string& message);
  void preempt(seq_state& s);
  void drop_cancelled();
  void snapshot();
  relokv::token_t sample(seq_state& s, const std::vector<float>& logits);

  serving_engine& eng_;
  const relokv_engine::tokenizer& tok_;
  metrics& metrics_;
  options opt_;
  std::vector<relokv::token_t> stops_;  // end of turn, end of text
  const relokv::recompute::any_strategy full_{relokv::recompute::full{}};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<job>> intake_;
  std::int32_t in_flight_ = 0;
  bool stopping_ = false;
  bool woken_ = false;
  int cancel_status_ = 0;  ///< cancel_all(): every job ends with this status
  std::string cancel_message_;

  // The scheduler thread's own.
  std::deque<std::unique_ptr<seq_state>> waiting_, prefilling_;
  std::vector<std::unique_ptr<seq_state>> running_;
  std::thread thread_;
};

}  // namespace relokv_server
