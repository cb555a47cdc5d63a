#pragma once
// relokv_server's scheduler: it only decides. Given the requests' queues it returns what a
// step does (which waiting requests to open, how many prompt rows each prefilling one gets,
// which running ones decode, whom to preempt when a token finds no block) and never calls the
// engine; engine_core.hpp runs its plans through the executor (executor.hpp) and hands the
// logits to the output processor (output_processor.hpp), as vLLM's v1 engine core runs its
// scheduler's SchedulerOutput. Tested alone in tests/server/server_unit_test.cpp.
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "request_state.hpp"

namespace relokv_server {

/// The loop's requests by where they are. `waiting` holds the waiting, waiting_for_store and
/// preempted ones (a preempted or escalated request goes to its front).
struct request_queues {
  std::deque<std::unique_ptr<request_state>> waiting;
  std::deque<std::unique_ptr<request_state>> prefilling;
  std::vector<std::unique_ptr<request_state>> running;  ///< decoding
  [[nodiscard]] std::int32_t live() const noexcept {
    return static_cast<std::int32_t>(prefilling.size() + running.size());
  }
};

/// The requests to open, in order, while the pool holds them: the first it cannot hold ends
/// this step's admissions (blocks come back as sequences end). `held`: waiting requests held
/// back because a prompt being prefilled computes one of their spans.
struct admission_plan {
  std::vector<request_state*> open;
  std::vector<request_state*> held;
};

struct prefill_chunk {
  request_state* r = nullptr;
  std::int32_t rows = 0;  ///< at least 1
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

  explicit scheduler(options o) : opt_(o) {}
  [[nodiscard]] const options& opts() const noexcept { return opt_; }

  /// Which waiting requests open now: in queue order while fewer than max_running (and the
  /// engine's `max_live`) are live, skipping those whose store entries are still on their way
  /// and those that share a span with a prompt being prefilled (held: they reuse it once it is
  /// committed instead of computing it beside it; those behind them go on).
  admission_plan admit(request_queues& q, std::int32_t max_live);
  /// This step's prompt chunks: a budget of step_tokens rows less one per running sequence,
  /// spent on the prefilling requests in order (admission, or least work first with the
  /// starved ahead), at most prefill_chunk each; the first in the order always moves.
  std::vector<prefill_chunk> prefill(request_queues& q);
  /// The running requests with a token to feed, in order (one decode row each).
  [[nodiscard]] std::vector<request_state*> decode(const request_queues& q) const;
  /// Whom to preempt when `needing` (running) finds no block for its token: the youngest
  /// running request not yet fed this step (it may be `needing` itself), never one that
  /// finished this step.
  [[nodiscard]] request_state* victim(const request_queues& q, request_state& needing) const;
  /// Whether a request whose open found the pool full waits (others are live and will give
  /// blocks back) rather than failing: `live` sequences open in the engine.
  [[nodiscard]] static bool wait_for_blocks(std::int32_t live) noexcept { return live > 0; }
  /// Whether `r`'s first distribution sends it back for full recompute (its escalation
  /// policy, before its first token only).
  [[nodiscard]] static bool escalate(const request_state& r, std::span<const float> logits);

 private:
  options opt_;
};

}  // namespace relokv_server
