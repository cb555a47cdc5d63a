#pragma once
// relokv_server's serving loop: one thread owns the engine and its relocatable_cache (plan,
// commit, release, extend), as relokv's threading contract says; HTTP threads hand it jobs
// (job.hpp) and read what it publishes. Each step it asks the scheduler (scheduler.hpp) what
// to do, has the executor (executor.hpp) run it on the engine, and hands every sequence's
// logits to the output processor (output_processor.hpp), as vLLM's v1 EngineCore does.
//
// Continuous batching: a step admits waiting requests, computes prompt chunks of at most
// `prefill_chunk` rows within one budget of `step_tokens` rows, then one decode token of every
// running sequence: two forwards (the prefill rows on the int16 tiles, the decode rows batched
// on the int8 kernels: a row takes the kernel it would take alone; docs/server.md), so a long
// prompt delays decode by one chunk at a time. Out of blocks: admission waits; a decode that
// cannot extend preempts the youngest sequence (its blocks committed and released; it is
// recomputed later, its answer so far continuing its question).
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "executor.hpp"
#include "job.hpp"
#include "metrics.hpp"
#include "output_processor.hpp"
#include "request_state.hpp"
#include "scheduler.hpp"
#include "serving_engine.hpp"
#include "tokenizer.hpp"

namespace relokv_server {

class engine_core {
 public:
  engine_core(serving_engine& eng, const relokv_engine::tokenizer& tok, metrics& m,
              scheduler::options o);
  ~engine_core();
  engine_core(const engine_core&) = delete;
  engine_core& operator=(const engine_core&) = delete;

  /// Queues a job. False when the queue is full or the loop stops (answer 503).
  bool submit(std::shared_ptr<job> j);
  /// Jobs queued or live: exact, each counted from submit() to its one finish or failure.
  [[nodiscard]] std::int32_t in_flight() const;
  /// Makes the loop look at its jobs now (a job was cancelled).
  void wake();
  /// Ends every job it has (queued, prefilling, running) with an error of `status` at the next
  /// step, and refuses new ones: a drain that ran out of time.
  void cancel_all(int status, const std::string& message);
  /// Finishes every job it has, then stops the thread.
  void stop();

 private:
  void loop();
  void step(std::vector<std::shared_ptr<job>>& incoming);
  void drop_cancelled();
  void admit();
  void prefill();
  void decode();
  /// Takes the logits of `r`'s prompt or last token: the request ends, or goes on decoding.
  void take(request_state& r, const std::vector<float>& logits);
  void preempt(request_state& r);
  /// The request's end: its sequence closed (committed), then the end published.
  void finish(request_state& r, const std::string& reason);
  void fail(request_state& r, int status, const std::string& message);
  void count_out();
  void snapshot();

  scheduler sched_;
  executor exec_;
  output_processor out_;
  metrics& metrics_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<job>> intake_;
  std::int32_t in_flight_ = 0;
  bool stopping_ = false;
  bool woken_ = false;
  int cancel_status_ = 0;  ///< cancel_all(): every job ends with this status
  std::string cancel_message_;

  request_queues q_;  // the loop thread's own
  std::thread thread_;
};

}  // namespace relokv_server
