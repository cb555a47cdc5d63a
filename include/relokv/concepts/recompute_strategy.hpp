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
