#pragma once
/// @file
/// The boundary-recompute policy axis.
#include <concepts>
#include <cstdint>
#include <span>

#include "relokv/block_table.hpp"
#include "relokv/layout/request_layout.hpp"

RELOKV_NAMESPACE_BEGIN

/// Decides which tokens of reused blocks a request recomputes.
///
/// Requirements:
///  - `s.select(layout, status, mask)`: `mask` has one entry per token (logical position) and
///    arrives with 1 for every token of a missed block and 0 elsewhere; select sets to 1 the
///    reused tokens to recompute. It never clears a 1. `status` has one entry per block.
///  - `s.dynamic()`: true when the strategy refines the mask layer by layer during prefill
///    (see recompute/deviation_topk.hpp for the refine protocol); static strategies return false.
///  - optionally `s.probes()`: true when the engine runs a probe pass first and the strategy
///    then chooses among its candidates (recompute/question_topk.hpp).
template <class S>
concept recompute_strategy = std::copy_constructible<S> &&
    requires(const S& s, const request_layout& layout, std::span<const block_status> status,
             std::span<std::uint8_t> mask) {
  { s.select(layout, status, mask) } -> std::same_as<void>;
  { s.dynamic() } -> std::convertible_to<bool>;
};

/// A strategy that refines its mask layer by layer during prefill (CacheBlend's deviation
/// check: recompute/deviation_topk.hpp has the engine's loop). What an engine calls:
///  - `s.steps()`: check steps; `s.check_layer(step)`: the layer step `step` measures at;
///  - `s.metric()`: the deviation the engine measures per token there;
///  - `s.refine(step, deviation, reused, mask, pinned)`: narrows `mask` from the measurement.
template <class S>
concept dynamic_strategy = recompute_strategy<S> &&
    requires(const S& s, std::int32_t step, std::span<const float> deviation,
             std::span<const std::uint8_t> reused, std::span<std::uint8_t> mask,
             std::span<const std::uint8_t> pinned) {
  { s.steps() } -> std::convertible_to<std::int32_t>;
  { s.check_layer(step) } -> std::convertible_to<std::int32_t>;
  s.metric();
  { s.refine(step, deviation, reused, mask, pinned) } -> std::same_as<void>;
};

/// A strategy that marks tokens computed at every layer whatever its later choice (EPIC's first
/// k beside CacheBlend's top tokens; the question of question_topk): `s.pin(layout, status,
/// pinned)`, called once per request before the first refine or the probe.
template <class S>
concept pinning_strategy = recompute_strategy<S> &&
    requires(const S& s, const request_layout& layout, std::span<const block_status> status,
             std::span<std::uint8_t> pinned) {
  { s.pin(layout, status, pinned) } -> std::same_as<void>;
};

/// A strategy whose engine runs a probe pass first (recompute/question_topk.hpp): the rows
/// that probe (`query_rows`), the layers whose attention counts (`counts_layer`), then the
/// tokens to compute from the attention mass those rows gave each token (`choose`).
template <class S>
concept probing_strategy = recompute_strategy<S> &&
    requires(const S& s, const request_layout& layout, std::span<std::uint8_t> rows,
             std::int32_t layer, std::span<const float> mass, std::span<const std::uint8_t> reused,
             std::span<std::uint8_t> mask, std::span<const std::uint8_t> pinned) {
  { s.probes() } -> std::convertible_to<bool>;
  { s.query_rows(layout, rows) } -> std::same_as<void>;
  { s.counts_layer(layer, layer) } -> std::convertible_to<bool>;
  { s.choose(mass, reused, mask, pinned) } -> std::same_as<void>;
};

/// A strategy whose engine attends by groups of blocks (recompute/ape.hpp): the reader's first
/// position (`query_start`) and the groups of a table of n blocks (`groups`).
template <class S>
concept grouped_strategy = recompute_strategy<S> &&
    requires(const S& s, const request_layout& layout, std::int32_t table_blocks) {
  { s.query_start(layout) } -> std::convertible_to<pos_t>;
  s.groups(layout, table_blocks);
};

/// True when the strategy's first mask names candidates rather than the tokens it computes: a
/// dynamic strategy narrows it layer by layer, a probing one after its probe. Most of their
/// reused tokens keep their cached K/V, so the cache copies (and fetches) those blocks even
/// when every token of one is a candidate.
template <recompute_strategy S>
[[nodiscard]] bool narrows_mask(const S& s) {
  if constexpr (requires { s.probes(); })
    if (s.probes()) return true;
  return static_cast<bool>(s.dynamic());
}

RELOKV_NAMESPACE_END
