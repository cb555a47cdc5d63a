#pragma once
/// @file
/// A run-time choice among the shipped strategies, so that one relocatable_cache serves
/// requests that use different PIC variants at the same time.
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <variant>

#include "relokv/recompute/ape.hpp"
#include "relokv/recompute/deviation_topk.hpp"
#include "relokv/recompute/first_k.hpp"
#include "relokv/recompute/full.hpp"
#include "relokv/recompute/none.hpp"
#include "relokv/recompute/question_topk.hpp"
#include "relokv/recompute/seam_window.hpp"

RELOKV_NAMESPACE_BEGIN
namespace recompute {

/// Holds one of none, first_k, seam_window, deviation_topk, full, first_k_and_topk,
/// seam_window_and_topk, question_topk, ape. Cost beside the static form: one std::visit (a jump
/// through a small table) per select/refine call, that is per request or per check layer, never per
/// token; and the size of the largest alternative.
class any_strategy {
 public:
  using variant_type = std::variant<none, first_k, seam_window, deviation_topk, full,
                                    first_k_and_topk, seam_window_and_topk, question_topk, ape>;

  any_strategy() = default;
  template <class S>
  requires std::is_constructible_v<variant_type, S&&> &&
      (!std::is_same_v<std::remove_cvref_t<S>, any_strategy>)any_strategy(S&& s)
      : v_(std::forward<S>(s)) {}  // NOLINT: implicit by design

  void select(const request_layout& l, std::span<const block_status> status,
              std::span<std::uint8_t> mask) const {
    std::visit([&](const auto& s) { s.select(l, status, mask); }, v_);
  }
  [[nodiscard]] bool dynamic() const noexcept {
    return std::visit([](const auto& s) { return s.dynamic(); }, v_);
  }
  /// Check steps of a dynamic alternative (0 for static ones).
  [[nodiscard]] std::int32_t steps() const noexcept {
    return with_dynamic([](const auto& d) { return d.steps(); }, [] { return std::int32_t{0}; });
  }
  /// The layer check step `step` measures (see deviation_topk::check_layer).
  [[nodiscard]] std::int32_t check_layer(std::int32_t step) const {
    return with_dynamic([&](const auto& d) { return d.check_layer(step); },
                        []() -> std::int32_t {
                          throw error(
                              "any_strategy::check_layer: the selected strategy is static (no "
                              "check steps)");
                        });
  }
  /// Marks the tokens the strategy computes at every layer (the pinned part of
  /// first_k_and_topk, seam_window_and_topk and question_topk); the others pin nothing. Call
  /// once per request, before the first refine (or the probe).
  void pin(const request_layout& l, std::span<const block_status> status,
           std::span<std::uint8_t> pinned) const {
    std::visit(
        [&](const auto& d) {
          if constexpr (pinning_strategy<std::decay_t<decltype(d)>>) d.pin(l, status, pinned);
        },
        v_);
  }
  /// True when the engine runs a probe pass first (question_topk's protocol).
  [[nodiscard]] bool probes() const noexcept {
    return std::visit(
        [](const auto& d) {
          if constexpr (probing_strategy<std::decay_t<decltype(d)>>)
            return static_cast<bool>(d.probes());
          else
            return false;
        },
        v_);
  }
  /// The APE alternative when held (the engine then attends by groups at the reader's
  /// tokens), else null.
  [[nodiscard]] const ape* grouped() const noexcept { return std::get_if<ape>(&v_); }
  /// The probing alternative's query_rows (question_topk's); an error for the others.
  void query_rows(const request_layout& l, std::span<std::uint8_t> rows) const {
    with_probing<void>("query_rows", [&](const auto& d) { d.query_rows(l, rows); });
  }
  /// The probing alternative's counts_layer; an error for the others.
  [[nodiscard]] bool counts_layer(std::int32_t layer, std::int32_t layers) const {
    return with_probing<bool>("counts_layer", [&](const auto& d) {
      return static_cast<bool>(d.counts_layer(layer, layers));
    });
  }
  /// The probing alternative's choose; an error for the others.
  void choose(std::span<const float> mass, std::span<const std::uint8_t> reused,
              std::span<std::uint8_t> mask, std::span<const std::uint8_t> pinned = {}) const {
    with_probing<void>("choose", [&](const auto& d) { d.choose(mass, reused, mask, pinned); });
  }
  /// The deviation metric of a dynamic alternative (the engine's token_deviation call); kL2
  /// for static ones.
  [[nodiscard]] deviation_metric metric() const noexcept {
    return with_dynamic([](const auto& d) { return d.metric(); },
                        [] { return deviation_metric::kL2; });
  }
  /// Forwards to the dynamic alternative; a static one has no steps, so any call is an error.
  /// @param pinned  what pin() marked (may be empty for deviation_topk)
  void refine(std::int32_t step, std::span<const float> deviation,
              std::span<const std::uint8_t> reused, std::span<std::uint8_t> mask,
              std::span<const std::uint8_t> pinned = {}) const {
    with_dynamic(
        [&](const auto& d) { d.refine(step, deviation, reused, mask, pinned); },
        [] {
          throw error("any_strategy::refine: the selected strategy is static (no check steps)");
        });
  }
  [[nodiscard]] const variant_type& get() const noexcept { return v_; }
  [[nodiscard]] std::size_t index() const noexcept { return v_.index(); }

 private:
  /// Calls f on the alternative held when it models probing_strategy (question_topk), or
  /// throws, naming `what`.
  template <class R, class F>
  R with_probing(const char* what, F&& f) const {
    return std::visit(
        [&](const auto& d) -> R {
          if constexpr (probing_strategy<std::decay_t<decltype(d)>>)
            return f(d);
          else
            throw error(std::string("any_strategy::") + what +
                        ": the selected strategy has no probe pass (question_topk has)");
        },
        v_);
  }
  /// Calls f on the alternative held when it models dynamic_strategy (deviation_topk,
  /// first_k_and_topk, seam_window_and_topk), or otherwise() when a static one is held.
  template <class F, class G>
  std::invoke_result_t<G> with_dynamic(F&& f, G&& otherwise) const {
    return std::visit(
        [&](const auto& d) -> std::invoke_result_t<G> {
          if constexpr (dynamic_strategy<std::decay_t<decltype(d)>>)
            return f(d);
          else
            return otherwise();
        },
        v_);
  }

  variant_type v_{none{}};
};
static_assert(recompute_strategy<any_strategy>,
              "recompute::any_strategy must model recompute_strategy");
// The alternatives by kind: what the engines dispatch on (with_dynamic, with_probing, pin).
static_assert(dynamic_strategy<deviation_topk> && dynamic_strategy<first_k_and_topk> &&
                  dynamic_strategy<seam_window_and_topk>,
              "the deviation strategies must model dynamic_strategy");
static_assert(pinning_strategy<first_k_and_topk> && pinning_strategy<seam_window_and_topk> &&
                  pinning_strategy<question_topk>,
              "the combined strategies and question_topk must model pinning_strategy");
static_assert(probing_strategy<question_topk>, "question_topk must model probing_strategy");
static_assert(grouped_strategy<ape>, "ape must model grouped_strategy");
static_assert(!dynamic_strategy<first_k> && !dynamic_strategy<question_topk> &&
                  !probing_strategy<deviation_topk> && !grouped_strategy<first_k>,
              "a static strategy models no other kind");
// any_strategy answers every kind's calls (an error where the alternative held has none).
static_assert(dynamic_strategy<any_strategy> && probing_strategy<any_strategy> &&
              pinning_strategy<any_strategy>);

}  // namespace recompute
RELOKV_NAMESPACE_END
