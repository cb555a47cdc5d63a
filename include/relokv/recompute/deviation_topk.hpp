#pragma once
/// @file
/// CacheBlend's selective recompute: the reused tokens with the highest KV deviation, chosen
/// layer by layer with gradual filtering.
///
/// Check layers. At layer 0 a token's K and V are functions of its own embedding only: no
/// attention has mixed any context in yet, so the deviation there is rounding and a top-k
/// over it is arbitrary. CacheBlend (and LMCache's blender: check layer 1, ratio 0.15)
/// computes every candidate through the first check layer's K/V, measures the deviation
/// there, and narrows the set at later check layers (gradual filtering).
///
/// Engine loop (dynamic strategies refine the mask as prefill goes):
/// @code
///   auto plan = cache.plan(layout, strategy);          // plan.compute: every candidate
///   const auto reused = plan.reused_mask();            // tokens whose KV came from the cache
///   std::vector<std::uint8_t> mask = plan.compute;
///   for (int layer = 0, step = 0; layer < num_layers; ++layer) {
///     // compute Q/K/V of this layer for the tokens with mask[t] == 1
///     if (step < strategy.steps() && strategy.check_layer(step) == layer) {
///       // deviation of the fresh K/V from the cached K/V (before they are overwritten), for
///       // the masked reused tokens
///       relokv::token_deviation(metric, cached_k, cached_v, fresh_k, fresh_v, n, width, dev);
///       strategy.refine(step++, dev_per_token, reused, mask);   // from here on
///     }
///     // write the K/V of this layer, attention (over all blocks) and MLP for the tokens still
///     // masked; those dropped keep their cached K/V from this layer on
///   }
/// @endcode
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "relokv/concepts/recompute_strategy.hpp"
#include "relokv/recompute/deviation.hpp"
#include "relokv/recompute/first_k.hpp"
#include "relokv/recompute/seam_window.hpp"

RELOKV_NAMESPACE_BEGIN
namespace recompute {

/// One check: at `layer`, keep the top `ratio` of the reused tokens by deviation.
struct deviation_check {
  std::int32_t layer = 1;
  float ratio = 0.15f;
  friend bool operator==(const deviation_check&, const deviation_check&) = default;
};

/// Selects, at each check layer, the top r fraction of the reused tokens by deviation
/// (CacheBlend; default: layer 1, r = 15%, as LMCache's blender). Every token of the relocated
/// spans is computed up to and including the first check layer's K/V; with later checks
/// r1 >= r2 >= ... the set shrinks layer by layer (gradual filtering). The metric is a hint for
/// the engine's token_deviation call: L2 (CacheBlend) or cosine (KVBoost). A check layer at or
/// past the model's last layer is never reached: every candidate is then computed throughout.
class deviation_topk {
 public:
  /// Checks at layers 1, 2, ...: `schedule` (r1 >= r2 >= ...), or `ratio` alone at layer 1.
  explicit deviation_topk(float ratio = 0.15f, deviation_metric metric = deviation_metric::kL2,
                          std::vector<float> schedule = {})
      : metric_(metric) {
    if (schedule.empty()) schedule.push_back(ratio);
    if (schedule.size() > kMaxChecks) too_many(schedule.size());
    for (std::size_t i = 0; i < schedule.size(); ++i)
      checks_[i] = {static_cast<std::int32_t>(i) + 1, schedule[i]};
    n_ = static_cast<std::int32_t>(schedule.size());
    validate();
  }
  /// An explicit schedule of (layer, ratio): layers strictly increasing from 0, ratios in
  /// [0, 1] and not increasing.
  explicit deviation_topk(std::span<const deviation_check> checks,
                          deviation_metric metric = deviation_metric::kL2)
      : metric_(metric) {
    if (checks.size() > kMaxChecks) too_many(checks.size());
    std::copy(checks.begin(), checks.end(), checks_.begin());
    n_ = static_cast<std::int32_t>(checks.size());
    validate();
  }
  deviation_topk(std::initializer_list<deviation_check> checks,
                 deviation_metric metric = deviation_metric::kL2)
      : deviation_topk(std::span<const deviation_check>(checks.begin(), checks.size()), metric) {}

  /// At most this many checks (held inline: a strategy is a small value, copied per variant).
  static constexpr std::size_t kMaxChecks = 8;

  /// Candidates for the first check: every token of every relocated span (with_seam: its
  /// first `seam` tokens).
  void select(const request_layout& l, std::span<const block_status> status,
              std::span<std::uint8_t> mask) const {
    if (seam_ > 0)
      detail::mark_relocated_seam(l, status, mask, seam_);
    else
      detail::mark_relocated_blocks(l, status, mask);
  }
  /// Candidates confined to the first `seam` tokens of each relocated span; 0 (the default):
  /// every token. For a sliding-window model (window W) whose layers below the first check
  /// layer L are all windowed: a token at offset >= L (W - 1) in its span sees nothing but its
  /// own span through those layers, so its K/V at L match a fresh computation (up to rounding:
  /// measured 0.0000 cosine on Gemma 3 at layers 1-4, docs/windows.md) and the check never
  /// prefers it. Computing it up to L is waste: with_seam(L (W - 1)) chooses the same tokens
  /// wherever the budget (ratio x reused tokens) is at most the seams' tokens, for less work.
  /// @throws error for a negative seam
  [[nodiscard]] deviation_topk with_seam(std::int32_t seam) const {
    if (seam < 0) throw error("deviation_topk: the seam must be >= 0, got " + std::to_string(seam));
    deviation_topk c = *this;
    c.seam_ = seam;
    return c;
  }
  [[nodiscard]] std::int32_t seam() const noexcept { return seam_; }
  [[nodiscard]] constexpr bool dynamic() const noexcept { return true; }
  /// Number of refine steps (check layers).
  [[nodiscard]] std::int32_t steps() const noexcept { return n_; }
  [[nodiscard]] deviation_metric metric() const noexcept { return metric_; }
  [[nodiscard]] float ratio(std::int32_t step) const { return at(step).ratio; }
  /// The layer whose fresh K/V check step `step` measures.
  [[nodiscard]] std::int32_t check_layer(std::int32_t step) const { return at(step).layer; }
  [[nodiscard]] std::span<const deviation_check> checks() const noexcept {
    return {checks_.data(), static_cast<std::size_t>(n_)};
  }
  /// Tokens whose deviation is at most `d` are never chosen, whatever the budget (KVBoost:
  /// 0.01 by cosine). Default 0.
  [[nodiscard]] deviation_topk with_min_deviation(float d) const {
    if (!(d >= 0.0f) || !std::isfinite(d))
      throw error("deviation_topk: the minimum deviation must be finite and >= 0, got " +
                  std::to_string(d));
    deviation_topk c = *this;
    c.min_deviation_ = d;
    return c;
  }
  [[nodiscard]] float min_deviation() const noexcept { return min_deviation_; }

  /// After check step `step`: keeps every token that is not reused (it has no cached value),
  /// every pinned token, and the ceil(r_step * reused) masked, reused, unpinned tokens with the
  /// highest deviation; clears the rest.
  /// @param deviation per token (logical position); read only where mask and reused are set
  /// @param reused    per token: 1 if its KV came from the cache (reuse_plan::reused_mask)
  /// @param mask      per token, in: computed at this layer; out: computed at the next
  /// @param pinned    per token (or empty): tokens another strategy keeps at every layer (see
  ///                  first_k_and_topk); they do not count against the budget
  void refine(std::int32_t step, std::span<const float> deviation,
              std::span<const std::uint8_t> reused, std::span<std::uint8_t> mask,
              std::span<const std::uint8_t> pinned = {}) const {
    if (step < 0 || step >= steps())
      throw error("deviation_topk::refine: step " + std::to_string(step) + " outside [0, " +
                  std::to_string(steps()) + ")");
    if (deviation.size() != mask.size() || reused.size() != mask.size() ||
        (!pinned.empty() && pinned.size() != mask.size()))
      throw error("deviation_topk::refine: deviation, reused, mask and pinned sizes differ");
    const auto n_reused = std::count(reused.begin(), reused.end(), std::uint8_t{1});
    const auto keep = static_cast<std::int64_t>(std::ceil(
        static_cast<double>(checks_[static_cast<std::size_t>(step)].ratio) * n_reused - 1e-9));
    std::vector<std::uint8_t> eligible(mask.size());
    for (std::size_t t = 0; t < mask.size(); ++t) {
      const bool pin = !pinned.empty() && pinned[t];
      eligible[t] = mask[t] && reused[t] && !pin;
      if (eligible[t]) mask[t] = 0;
    }
    if (min_deviation_ > 0.0f)
      for (std::size_t t = 0; t < mask.size(); ++t)
        if (eligible[t] && !(deviation[t] > min_deviation_)) eligible[t] = 0;
    select_topk(deviation, eligible, keep, mask);
  }

 private:
  [[noreturn]] static void too_many(std::size_t n) {
    throw error("deviation_topk: " + std::to_string(n) + " checks, at most " +
                std::to_string(kMaxChecks));
  }
  const deviation_check& at(std::int32_t step) const {
    if (step < 0 || step >= n_)
      throw error("deviation_topk: check step " + std::to_string(step) + " outside [0, " +
                  std::to_string(n_) + ")");
    return checks_[static_cast<std::size_t>(step)];
  }
  void validate() const {
    if (n_ == 0) throw error("deviation_topk: at least one check");
    for (std::size_t i = 0; i < static_cast<std::size_t>(n_); ++i) {
      const deviation_check& c = checks_[i];
      if (!(c.ratio >= 0.0f && c.ratio <= 1.0f))
        throw error("deviation_topk: ratios must be in [0, 1], got " + std::to_string(c.ratio));
      if (c.layer < 0) throw error("deviation_topk: check layer " + std::to_string(c.layer));
      if (i > 0 && c.layer <= checks_[i - 1].layer)
        throw error("deviation_topk: check layers must increase, got " +
                    std::to_string(checks_[i - 1].layer) + " then " + std::to_string(c.layer));
      if (i > 0 && c.ratio > checks_[i - 1].ratio)
        throw error("deviation_topk: the schedule must not grow (gradual filtering)");
    }
  }

  deviation_metric metric_ = deviation_metric::kL2;
  float min_deviation_ = 0.0f;
  std::int32_t seam_ = 0;
  std::array<deviation_check, kMaxChecks> checks_{};
  std::int32_t n_ = 0;
};
static_assert(recompute_strategy<deviation_topk>,
              "recompute::deviation_topk must model recompute_strategy");

/// A static strategy's tokens pinned (computed at every layer) and CacheBlend's
/// highest-deviation tokens chosen among the other relocated tokens at the check layers.
/// The two target different errors: the pinned ones where a span meets new context, the
/// deviation-chosen ones inside spans.
///   - first_k_and_topk: EPIC's first k tokens of every relocated span (they absorb attention
///     as sinks of the new context) plus CacheBlend.
///   - seam_window_and_topk: KVBoost as its authors define it. Its selective repair recomputes
///     the last R = 16 tokens before each seam; a chunk matched by content hash (an
///     approximate match, which every relocated span is) forces CacheBlend at 15% by cosine
///     deviation, ignoring tokens whose deviation is below 0.01 (KVBoost's documentation and
///     its cacheblend.py). Both parts run here together, as one pass.
/// @tparam Pin a static recompute_strategy whose selection is pinned
template <class Pin>
class pinned_topk {
 public:
  pinned_topk(Pin pin, deviation_topk topk) : pin_(std::move(pin)), topk_(std::move(topk)) {}
  explicit pinned_topk(std::int32_t k = 16, float ratio = 0.15f) : pin_(k), topk_(ratio) {}

  /// Candidates: every token of every relocated span, and the pinned ones.
  void select(const request_layout& l, std::span<const block_status> status,
              std::span<std::uint8_t> mask) const {
    topk_.select(l, status, mask);
    pin_.select(l, status, mask);
  }
  [[nodiscard]] constexpr bool dynamic() const noexcept { return true; }
  /// Marks the tokens computed at every layer whatever their deviation.
  void pin(const request_layout& l, std::span<const block_status> status,
           std::span<std::uint8_t> pinned) const {
    pin_.select(l, status, pinned);
  }
  [[nodiscard]] std::int32_t steps() const noexcept { return topk_.steps(); }
  [[nodiscard]] std::int32_t check_layer(std::int32_t step) const {
    return topk_.check_layer(step);
  }
  [[nodiscard]] deviation_metric metric() const noexcept { return topk_.metric(); }
  void refine(std::int32_t step, std::span<const float> deviation,
              std::span<const std::uint8_t> reused, std::span<std::uint8_t> mask,
              std::span<const std::uint8_t> pinned) const {
    if (pinned.size() != mask.size())
      throw error("pinned_topk::refine: pass the mask of pin() (one entry per token)");
    topk_.refine(step, deviation, reused, mask, pinned);
  }
  [[nodiscard]] const Pin& pinned_strategy() const noexcept { return pin_; }
  [[nodiscard]] const deviation_topk& topk() const noexcept { return topk_; }

 private:
  Pin pin_;
  deviation_topk topk_;
};

using first_k_and_topk = pinned_topk<first_k>;
using seam_window_and_topk = pinned_topk<seam_window>;
static_assert(recompute_strategy<first_k_and_topk>,
              "recompute::first_k_and_topk must model recompute_strategy");
static_assert(recompute_strategy<seam_window_and_topk>,
              "recompute::seam_window_and_topk must model recompute_strategy");

/// KVBoost's defaults: seam window 16 before each seam, CacheBlend at 15% by cosine
/// deviation above 0.01.
inline seam_window_and_topk kvboost(std::int32_t window = 16, float ratio = 0.15f) {
  return {seam_window(window),
          deviation_topk(ratio, deviation_metric::kCosine).with_min_deviation(0.01f)};
}

}  // namespace recompute
RELOKV_NAMESPACE_END
