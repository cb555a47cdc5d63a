// The one-request loop of sequence.hpp, over any engine's sequence calls.
#include "sequence.hpp"

#include <limits>

namespace relokv_engine {

std::vector<float> sequence_engine::prefill(const relokv::request_layout& layout,
                                            const relokv::recompute::any_strategy& strategy,
                                            prefill_stats* stats, const relokv::extra_keys& extras,
                                            std::uint64_t principal) {
  if (current_ >= 0)
    throw std::logic_error("prefill: a request is live (sequence " + std::to_string(current_) +
                           "); end() it first");
  const seq_id s = open(layout, strategy, stats, extras, principal);
  try {
    auto logits = prefill_step(s, std::numeric_limits<std::int32_t>::max(), stats);
    if (logits.empty())
      throw std::logic_error(
          "prefill: the engine left rows of the prompt after a step of any size");
    current_ = s;
    return logits;
  } catch (...) {
    close(s, false);
    throw;
  }
}

std::vector<float> sequence_engine::decode(relokv::token_t token) {
  if (current_ < 0) throw std::logic_error("decode: no live request (prefill first)");
  if (!append(current_, token)) throw out_of_blocks("decode: no KV block free for the token", 1);
  const seq_id s = current_;
  return std::move(decode_step({&s, 1})[0]);
}

std::vector<relokv::token_t> sequence_engine::generate(const std::vector<float>& first_logits,
                                                       std::int32_t max_tokens,
                                                       relokv::token_t stop) {
  std::vector<relokv::token_t> out;
  relokv::token_t t = argmax(first_logits);
  for (std::int32_t i = 0; i < max_tokens; ++i) {
    out.push_back(t);
    if (t == stop) break;
    if (i + 1 < max_tokens) t = argmax(decode(t));
  }
  return out;
}

void sequence_engine::end(bool commit) {
  if (current_ < 0) return;
  const seq_id s = current_;
  current_ = -1;  // a close() that throws still ends the loop's request
  close(s, commit);
}

}  // namespace relokv_engine
