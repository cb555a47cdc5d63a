#pragma once
// A request's state inside relokv_server's serving loop (engine_core.hpp): one status, where
// the loop used to keep a queue position and a handful of flags. Written by the loop's thread
// only: the scheduler (decides), the executor (runs the engine) and the output processor
// (samples and publishes) each own the fields their comments name.
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string_view>
#include <vector>

#include <relokv/store/prefetching_store.hpp>
#include <relokv/types.hpp>

#include "detok.hpp"
#include "job.hpp"

namespace relokv_server {

/// Where a request is. A request moves waiting -> [waiting_for_store ->] prefilling ->
/// decoding -> finished; a preemption sends a decoding request to preempted (it waits first
/// in line and is prefilled again, its answer so far continuing its question); an escalation
/// sends a prefilling one back to waiting, first in line, for full recompute. Any status may
/// go to finished (an error, a cancellation, a drain).
enum class request_status : std::uint8_t {
  waiting,            ///< queued for admission
  waiting_for_store,  ///< admitted by the scheduler, its store entries still on their way
  prefilling,         ///< open in the engine, its prompt computed a chunk a step
  decoding,           ///< its first token sampled: one token a step
  preempted,          ///< released to free blocks: recomputed when admitted again
  finished,           ///< answered or failed: counted out of the loop once
};

[[nodiscard]] constexpr std::string_view to_string(request_status s) noexcept {
  switch (s) {
    case request_status::waiting:
      return "waiting";
    case request_status::waiting_for_store:
      return "waiting_for_store";
    case request_status::prefilling:
      return "prefilling";
    case request_status::decoding:
      return "decoding";
    case request_status::preempted:
      return "preempted";
    case request_status::finished:
      return "finished";
  }
  return "unknown";
}

struct request_state {
  std::shared_ptr<job> j;
  request_status status = request_status::waiting;
  /// Served from here on with full recompute of j->full_prompt (escalated).
  bool full = false;

  // The executor's.
  std::int32_t seq = -1;  ///< the engine's sequence while open, else -1
  /// The store entries its next open reads, being fetched off the loop's thread; dropped once
  /// it opens.
  std::unique_ptr<relokv::prefetch_ticket> fetch;
  bool prompt_counted = false;  ///< its first attempt's plan is what the request cost

  // The scheduler's.
  /// Its prompt's spans as the cache keys them (span_ids), computed when first looked at.
  std::optional<std::vector<std::uint64_t>> spans;
  /// Prompt rows its open left to compute, less the rows of its chunks since (least work first).
  std::int64_t rows_left = 0;
  std::int32_t passed = 0;    ///< steps in a row it was prefilling and got no rows
  bool starved = false;       ///< passed kStarveSteps times: goes first until it is prefilled
  bool span_waited = false;   ///< held back for a span at least once (counted once)
  bool fetch_waited = false;  ///< waited for the store at least once (counted once)

  // The output processor's.
  std::vector<relokv::token_t> generated;
  std::optional<incremental_text> text;  ///< the answer's text, one token at a time
  relokv::token_t next = -1;             ///< sampled, not yet fed (decoding)
  std::mt19937_64 rng;
  std::optional<clock_type::time_point> last_token;  ///< none before the first token

  /// Not yet answered and never escalated: its spans are computed fresh if it opens now.
  [[nodiscard]] bool fresh() const noexcept { return !full && generated.empty(); }
  [[nodiscard]] bool ended() const noexcept { return status == request_status::finished; }
};

}  // namespace relokv_server
