// relokv_server's output processor (output_processor.hpp): sampling a token, the answer's
// text one token at a time, stop strings, and the end of a request.
#include "output_processor.hpp"

#include "llama_engine.hpp"  // argmax

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace relokv_server {
namespace {
/// Bytes of `s` that end on a whole UTF-8 character (an incomplete last one held back).
std::size_t utf8_whole(const std::string& s, std::size_t n) {
  std::size_t i = n;
  // Back over continuation bytes to the lead byte of the last character.
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80 && n - i < 3) --i;
  if (i == 0) return n;
  const auto lead = static_cast<unsigned char>(s[i - 1]);
  const std::size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return n - (i - 1) >= want ? n : i - 1;
}
}  // namespace

output_processor::output_processor(const relokv_engine::tokenizer& tok, metrics& m)
    : tok_(tok), metrics_(m) {
  for (const std::string& s : tok_.stop_texts())
    if (const auto id = tok_.id(s); id >= 0) stops_.push_back(id);
}

relokv::token_t output_processor::sample(request_state& s, const std::vector<float>& logits) {
  const chat_request& r = s.j->req;
  // Greedy at 0 (and below kGreedyTemperature, which parsing maps to 0); a distribution that
  // cannot be sampled (a temperature whose 1 / T overflows, logits that are not finite) is
  // served greedily rather than as NaN.
  if (r.temperature < kGreedyTemperature || !std::isfinite(1.0 / r.temperature))
    return relokv_engine::argmax(logits);
  // Softmax at the temperature, then the nucleus (top_p) in descending order, drawn with the
  // request's own generator: the same seed gives the same answer whatever the batch.
  const double inv_t = 1.0 / r.temperature;
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (std::size_t i = 0; i < logits.size(); ++i)
    sum += p[i] = std::exp((double(logits[i]) - mx) * inv_t);
  if (!std::isfinite(sum) || !(sum > 0)) return relokv_engine::argmax(logits);
  // The nucleus without sorting the vocabulary: the most likely candidates are ordered a
  // growing window at a time (64, 256, ...) until they hold top_p of the mass; top_p = 1 draws
  // over the whole vocabulary in index order.
  const auto by_p = [&](std::int32_t a, std::int32_t b) {
    return p[static_cast<std::size_t>(a)] > p[static_cast<std::size_t>(b)] ||
           (p[static_cast<std::size_t>(a)] == p[static_cast<std::size_t>(b)] && a < b);
  };
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::size_t keep = order.size();
  double mass = sum;
  if (r.top_p < 1.0) {
    for (std::size_t window = 64;; window *= 4) {
      const std::size_t w = std::min(window, order.size());
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(w), order.end(),
                        by_p);
      keep = 0;
      mass = 0;
      while (keep < w && (keep == 0 || mass < r.top_p * sum))
        mass += p[static_cast<std::size_t>(order[keep++])];
      if (mass >= r.top_p * sum || w == order.size()) break;
    }
  }
  // One 53-bit uniform from the generator (std::uniform_real_distribution's draws are the
  // library's choice; this is the same on every build).
  const double u = double(s.rng() >> 11) * 0x1.0p-53 * mass;
  double acc = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += p[static_cast<std::size_t>(order[i])];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

std::optional<std::string> output_processor::accept(request_state& s,
                                                    const std::vector<float>& logits) {
  const relokv::token_t t = sample(s, logits);
  const auto now = clock_type::now();
  if (!s.last_token)
    metrics_.ttft(std::chrono::duration<double>(now - s.j->arrived).count());
  else
    metrics_.inter_token(std::chrono::duration<double>(now - *s.last_token).count());
  s.last_token = now;
  s.next = -1;
  if (std::find(stops_.begin(), stops_.end(), t) != stops_.end()) return "stop";
  s.generated.push_back(t);
  {
    const std::lock_guard lock(s.j->mu);
    s.j->completion_tokens = static_cast<std::int32_t>(s.generated.size());
  }
  // The text grows by this token's piece (a few tokens decoded, not the answer); a stop
  // string is looked for where it could end in that piece.
  if (!s.text) s.text.emplace(tok_);
  const std::size_t had = s.text->text().size(), redone = s.text->redecoded();
  const std::string& text = s.text->push(t);
  for (const auto& stop : s.j->req.stop) {
    const std::size_t from =
        s.text->redecoded() != redone || had < stop.size() ? 0 : had - stop.size() + 1;
    if (text.find(stop, from) != std::string::npos) return "stop";
  }
  if (static_cast<std::int32_t>(s.generated.size()) >= s.j->req.max_tokens) return "length";
  s.next = t;
  publish(s, text, false);
  return std::nullopt;
}

void output_processor::publish(request_state& s, const std::string& text, bool final) {
  std::size_t n = text.size();
  if (final) {
    for (const auto& stop : s.j->req.stop)
      if (const auto p = text.find(stop); p != std::string::npos) n = std::min(n, p);
  } else {
    // Hold back what could still become a stop sequence, and an incomplete character.
    std::size_t hold = 0;
    for (const auto& stop : s.j->req.stop) hold = std::max(hold, stop.size() - 1);
    n = n > hold ? n - hold : 0;
    n = utf8_whole(text, n);
  }
  job& j = *s.j;
  {
    const std::lock_guard lock(j.mu);
    // A recompute after preemption publishes from where the client is, never less.
    if (n > j.text.size()) j.text.assign(text, 0, n);
    if (final) j.done = true;
  }
  j.cv.notify_all();
  if (j.on_update) j.on_update();
}

void output_processor::finish(request_state& s, const std::string& reason) {
  s.next = -1;
  metrics_.completion_tokens(static_cast<std::int64_t>(s.generated.size()));
  {
    const std::lock_guard lock(s.j->mu);
    s.j->finish_reason = reason;
    s.j->completion_tokens = static_cast<std::int32_t>(s.generated.size());
  }
  publish(s, s.text ? s.text->text() : std::string(), true);
}

void output_processor::fail(request_state& s, int status, const std::string& message) {
  s.next = -1;
  job& j = *s.j;
  {
    const std::lock_guard lock(j.mu);
    j.error_status = status;
    j.error_message = message;
    j.done = true;
  }
  j.cv.notify_all();
  if (j.on_update) j.on_update();
}

}  // namespace relokv_server
