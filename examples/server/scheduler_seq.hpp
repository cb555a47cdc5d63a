#pragma once
// A request's state inside relokv_server's scheduler (scheduler.cpp: batching;
// scheduler_output.cpp: sampling and what the client reads).
#include "detok.hpp"
#include "scheduler.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace relokv_server {

struct scheduler::seq_state {
  std::shared_ptr<job> j;
  std::int32_t id = -1;
  std::vector<relokv::token_t> generated;
  std::optional<incremental_text> text;  ///< the answer's text, one token at a time
  relokv::token_t next = -1;             ///< sampled, not yet fed
  std::mt19937_64 rng;
  bool first_token_seen = false;
  bool prompt_counted = false;
  bool full = false;  ///< escalated: served from here on with full recompute of full_prompt
  clock_type::time_point last_token;
  std::size_t published = 0;  ///< bytes of text published
  bool ended = false;         ///< finished or failed: counted out of in_flight_ once
  /// Its prompt's spans as the cache keys them (span_ids), computed at its first admission.
  std::optional<std::vector<std::uint64_t>> spans;
  bool span_waited = false;  ///< held back at least once (counted once in the metrics)
  /// The store entries its next open() reads, being fetched off this thread (prefetch());
  /// dropped once it opens.
  std::unique_ptr<relokv::prefetch_ticket> fetch;
  bool fetch_waited = false;  ///< waited for a fetch at least once (counted once)
  /// Prompt rows its open() left to compute, less the rows of its steps since (the order of
  /// least_work_first).
  std::int64_t rows_left = 0;
  std::int32_t passed = 0;  ///< steps in a row it was prefilling and got no rows
  bool starved = false;     ///< passed kStarveSteps times: goes first until it is prefilled
};

}  // namespace relokv_server
