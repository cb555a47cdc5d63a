#pragma once
/// @file
/// CacheBlend's selective recompute: the reused tokens with the highest KV deviation, chosen
/// layer by layer with gradual filtering.
///
/// Engine loop (dynamic strategies refine the mask as prefill goes):
/// @code
///   auto plan = cache.plan(layout, strategy);          // plan.compute: the check-layer set
///   const auto reused = plan.reused_mask();            // tokens whose KV came from the cache
///   std::vector<std::uint8_t> mask = plan.compute;
///   for (int layer = 0, step = 0; layer < num_layers; ++layer) {
///     // compute Q/K/V, attention and MLP of this layer for the tokens with mask[t] == 1,
///     // writing their K/V into the plan's (copied-on-write) blocks; attention reads all
///     if (step < strategy.steps()) {
///       // deviation of the fresh K/V from the cached K/V, for the masked reused tokens
///       relokv::token_deviation(metric, cached_k, cached_v, fresh_k, fresh_v, n, width, dev);
///       strategy.refine(step++, dev_per_token, reused, mask);   // mask for the next layer
///     }
///   }
/// @endcode
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "relokv/concepts/recompute_strategy.hpp"
#include "relokv/recompute/deviation.hpp"
#include "relokv/recompute/first_k.hpp"

RELOKV_NAMESPACE_BEGIN
namespace recompute {

/// Selects, at each check step, the top r_step fraction of the reused tokens by deviation
/// (CacheBlend; default r = 15%). The first step measures every token of the relocated spans;
/// with a schedule r1 >= r2 >= ... the set shrinks step by step (gradual filtering). The metric
/// is a hint for the engine's token_deviation call: L2 (CacheBlend) or cosine (KVBoost).
class deviation_topk {
 public:
  explicit deviation_topk(float ratio = 0.15f, deviation_metric metric = deviation_metric::kL2,
                          std::vector<float> schedule = {})
      : metric_(metric), schedule_(std::move(schedule)) {
    if (schedule_.empty()) schedule_.push_back(ratio);
    for (std::size_t i = 0; i < schedule_.size(); ++i) {
      const float r = schedule_[i];
      if (!(r >= 0.0f && r <= 1.0f))
        throw error("deviation_topk: ratios must be in [0, 1], got " + std::to_string(r));
      if (i > 0 && r > schedule_[i - 1])
        throw error("deviation_topk: the schedule must not grow (gradual filtering)");
    }
  }

  /// Candidates for the first check: every token of every relocated span.
  void select(const request_layout& l, std::span<const block_status> status,
              std::span<std::uint8_t> mask) const {
    for (std::int32_t b = 0; b < l.num_blocks(); ++b)
      if (status[static_cast<std::size_t>(b)] == block_status::kRelocatedHit)
        detail::mark(mask, l.blocks[static_cast<std::size_t>(b)].pos0,
                     l.blocks[static_cast<std::size_t>(b)].len);
  }
  [[nodiscard]] constexpr bool dynamic() const noexcept { return true; }
  /// Number of refine steps (check layers).
  [[nodiscard]] std::int32_t steps() const noexcept {
    return static_cast<std::int32_t>(schedule_.size());
  }
  [[nodiscard]] deviation_metric metric() const noexcept { return metric_; }
  [[nodiscard]] float ratio(std::int32_t step) const {
    return schedule_.at(static_cast<std::size_t>(step));
  }

  /// After check step `step`: keeps every token that is not reused (it has no cached value) and
  /// the ceil(r_step * reused) masked reused tokens with the highest deviation; clears the rest.
  /// @param deviation per token (logical position); read only where mask and reused are set
  /// @param reused    per token: 1 if its KV came from the cache (reuse_plan::reused_mask)
  /// @param mask      per token, in: computed at this layer; out: computed at the next
  void refine(std::int32_t step, std::span<const float> deviation,
              std::span<const std::uint8_t> reused, std::span<std::uint8_t> mask) const {
    if (step < 0 || step >= steps())
      throw error("deviation_topk::refine: step " + std::to_string(step) + " outside [0, " +
                  std::to_string(steps()) + ")");
    if (deviation.size() != mask.size() || reused.size() != mask.size())
      throw error("deviation_topk::refine: deviation, reused and mask sizes differ");
    const auto n_reused = std::count(reused.begin(), reused.end(), std::uint8_t{1});
    const auto keep = static_cast<std::int64_t>(std::ceil(
        static_cast<double>(schedule_[static_cast<std::size_t>(step)]) * n_reused - 1e-9));
    std::vector<std::uint8_t> eligible(mask.size());
    for (std::size_t t = 0; t < mask.size(); ++t) {
      eligible[t] = mask[t] && reused[t];
      if (eligible[t]) mask[t] = 0;
    }
    select_topk(deviation, eligible, keep, mask);
  }

 private:
  deviation_metric metric_ = deviation_metric::kL2;
  std::vector<float> schedule_;
};
static_assert(recompute_strategy<deviation_topk>,
              "recompute::deviation_topk must model recompute_strategy");

}  // namespace recompute
RELOKV_NAMESPACE_END
