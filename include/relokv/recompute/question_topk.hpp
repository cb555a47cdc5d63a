#pragma once
/// @file
/// Question-driven selective recompute: the question's own attention decides which relocated
/// tokens are recomputed.
///
/// Follows A3 (arXiv 2511.17560) and ProphetKV (arXiv 2602.02579): what a relocated span gets
/// wrong matters where the question looks, so the question is run first over the relocated
/// spans as they are cached (the probe), and the attention each span token receives from the
/// question's tokens, summed over heads and the deeper layers (attention_mass.hpp), ranks the
/// tokens.
/// The top `ratio` of the relocated tokens, with EPIC's first k of every span pinned when k >
/// 0, are then computed at every layer in a second pass, together with everything the request
/// computes anyway. Departures: one global set (the sum over layers), not a per-layer one, so
/// the second pass is an ordinary static mask; the probe is counted as work (its tokens are
/// computed twice).
///
/// Engine protocol (probes() is true; examples/engine/llama_engine.cpp runs it):
/// @code
///   auto plan = cache.plan(layout, strategy);   // plan.compute: every relocated token (its
///                                               // block is private: the probe may choose it)
///   const auto reused = plan.reused_mask();
///   std::vector<std::uint8_t> pinned(n), rows(n);
///   strategy.pin(layout, status, pinned);        // EPIC's first k
///   strategy.query_rows(layout, rows);           // the question: the last segment
///   // base = candidates not reused, or pinned; probe: the base through every layer, adding
///   // attention_mass of the base's `rows` tokens into mass at the layers counts_layer names
///   strategy.choose(mass, reused, mask, pinned); // mask: base + the top ratio by mass
///   // second pass: the tokens of mask through every layer, as a static strategy
/// @endcode
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "relokv/concepts/recompute_strategy.hpp"
#include "relokv/recompute/deviation.hpp"
#include "relokv/recompute/first_k.hpp"

RELOKV_NAMESPACE_BEGIN
namespace recompute {

/// Recomputes the relocated tokens the question attends to most (see the file comment).
class question_topk {
 public:
  /// @param ratio   share of the relocated tokens chosen by the question's attention, [0, 1]
  /// @param first_k EPIC's first k tokens of every relocated span, pinned (0: none), [0, 32]
  /// @param from    the layers whose attention counts: from layer floor(from * layers) on,
  ///                [0, 1). Default 0.5, the deeper half: on SmolLM2 (24 questions, r = 15%)
  ///                first-token KL 0.19 against 0.34 counting every layer, 0.30 skipping the
  ///                first two, 0.83 counting the shallow half only.
  explicit question_topk(float ratio = 0.15f, std::int32_t first_k = 0, float from = 0.5f)
      : ratio_(ratio), k_(first_k), from_(from) {
    if (!(from >= 0.0f && from < 1.0f))
      throw error("question_topk: from must be in [0, 1), got " + std::to_string(from));
    if (!(ratio >= 0.0f && ratio <= 1.0f))
      throw error("question_topk: ratio must be in [0, 1], got " + std::to_string(ratio));
    if (first_k < 0 || first_k > 32)
      throw error("question_topk: first_k must be in [0, 32], got " + std::to_string(first_k));
  }
  /// Candidates: every token of every relocated span (the probe decides which are computed).
  void select(const request_layout& l, std::span<const block_status> status,
              std::span<std::uint8_t> mask) const {
    detail::mark_relocated_blocks(l, status, mask);
  }
  [[nodiscard]] constexpr bool dynamic() const noexcept { return false; }
  /// The engine runs a probe pass before the one that counts.
  [[nodiscard]] constexpr bool probes() const noexcept { return true; }
  [[nodiscard]] float ratio() const noexcept { return ratio_; }
  [[nodiscard]] std::int32_t k() const noexcept { return k_; }
  [[nodiscard]] float from() const noexcept { return from_; }
  /// Whether the probe adds layer `layer`'s attention (of a model of `layers` layers).
  [[nodiscard]] bool counts_layer(std::int32_t layer, std::int32_t layers) const noexcept {
    return layer >= static_cast<std::int32_t>(from_ * static_cast<float>(layers));
  }

  /// Marks EPIC's first k tokens of every relocated span: computed in both passes, outside the
  /// ratio.
  void pin(const request_layout& l, std::span<const block_status> status,
           std::span<std::uint8_t> pinned) const {
    if (k_ > 0) first_k(k_).select(l, status, pinned);
  }
  /// Marks the tokens whose attention ranks: every segment after the layout's last span (the
  /// question and whatever follows it); without a span, the last segment.
  /// @throws error when the layout ends with a span: nothing asks a question of the spans
  void query_rows(const request_layout& l, std::span<std::uint8_t> rows) const {
    if (rows.size() != static_cast<std::size_t>(l.num_tokens()))
      throw error("question_topk::query_rows: rows has " + std::to_string(rows.size()) +
                  " entries for " + std::to_string(l.num_tokens()) + " tokens");
    if (l.segments.empty()) return;
    std::size_t last = l.segments.size();
    for (std::size_t i = l.segments.size(); i-- > 0;)
      if (l.segments[i].kind == segment_kind::kSpan) {
        last = i;
        break;
      }
    if (last == l.segments.size()) {  // no span: the last segment asks
      const segment& s = l.segments.back();
      detail::mark(rows, s.first_token, s.num_tokens);
      return;
    }
    if (last + 1 == l.segments.size())
      throw error(
          "question_topk: the layout ends with a span, so no question follows the "
          "spans to rank their tokens by (add a question segment, or use another "
          "strategy)");
    for (std::size_t i = last + 1; i < l.segments.size(); ++i)
      detail::mark(rows, l.segments[i].first_token, l.segments[i].num_tokens);
  }
  /// After the probe: keeps every masked token that is not reused (it has no cached value) and
  /// every pinned one, and adds the ceil(ratio * candidates) masked, reused, unpinned tokens
  /// with the most attention; clears the other candidates.
  /// @param mass   per token: attention received from the question rows (attention_mass)
  /// @param reused per token: 1 if its KV came from the cache (reuse_plan::reused_mask)
  /// @param mask   in: the plan's candidates; out: the tokens the second pass computes
  /// @param pinned per token (or empty): what pin() marked
  void choose(std::span<const float> mass, std::span<const std::uint8_t> reused,
              std::span<std::uint8_t> mask, std::span<const std::uint8_t> pinned = {}) const {
    if (mass.size() != mask.size() || reused.size() != mask.size() ||
        (!pinned.empty() && pinned.size() != mask.size()))
      throw error("question_topk::choose: mass, reused, mask and pinned sizes differ");
    std::vector<std::uint8_t> eligible(mask.size());
    std::int64_t candidates = 0;
    for (std::size_t t = 0; t < mask.size(); ++t) {
      const bool pin = !pinned.empty() && pinned[t];
      eligible[t] = mask[t] && reused[t] && !pin;
      candidates += eligible[t];
      if (eligible[t]) mask[t] = 0;
    }
    const auto keep =
        static_cast<std::int64_t>(std::ceil(static_cast<double>(ratio_) * candidates - 1e-9));
    select_topk(mass, eligible, keep, mask);
  }

 private:
  float ratio_;
  std::int32_t k_;
  float from_;
};
static_assert(recompute_strategy<question_topk>,
              "recompute::question_topk must model recompute_strategy");

}  // namespace recompute
RELOKV_NAMESPACE_END
