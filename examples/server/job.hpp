#pragma once
// One chat completion as the HTTP side and the serving loop share it (engine_core.hpp): the
// request, filled before submit(), and what the loop publishes (the answer's text, the end).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include <relokv/hash/block_keys.hpp>
#include <relokv/recompute/any_strategy.hpp>
#include <relokv/recompute/escalation.hpp>

#include "api.hpp"

namespace relokv_server {

using clock_type = std::chrono::steady_clock;

/// One chat completion between an HTTP thread and the serving loop. The HTTP thread fills the
/// request part and waits on `cv` (or reads on `on_update`); the loop's output processor
/// publishes text (whole UTF-8 characters, never a prefix of a stop sequence) and, at the end,
/// the finish reason and usage.
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
  /// Set by the HTTP thread when its client went away: the loop releases the sequence
  /// (engine_core::wake() makes it look now).
  std::atomic<bool> cancelled{false};
  /// Called by the loop's thread, without any lock held, after each publish (text, the end, an
  /// error): the HTTP layer's cue to read what changed (it reads on its own side: the loop never
  /// builds a response). Set before submit(), then read-only.
  std::function<void()> on_update;

  // Published by the output processor under mu.
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

}  // namespace relokv_server
