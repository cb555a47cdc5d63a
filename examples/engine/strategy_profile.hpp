#pragma once
// Which recompute strategy a model can be served with: a strategy named by kind and budget,
// and the calibration profile (JSON) that relokv_rag --calibrate writes and the engines load.
#include <cstdint>
#include <string>
#include <vector>

#include <relokv/recompute/any_strategy.hpp>
#include <relokv/recompute/escalation.hpp>

#include "llama_engine.hpp"

namespace relokv_engine {

/// A strategy by kind and budget: none, full, first_k (k), seam_window (k), kvboost (k, r),
/// deviation_topk (r), union (k, r: first_k_and_topk).
struct strategy_spec {
  std::string kind = "none";
  std::int32_t k = 0;
  float ratio = 0.0f;
  float temperature = 0.9f, scale = 0.9f;  ///< APE's (kind "ape")
  float from = 0.5f;                       ///< question_topk's first counted layer (fraction)
  /// Short label: "first_k k=8", "deviation_topk r=15%", ...
  [[nodiscard]] std::string label() const;
  /// @throws std::invalid_argument for an unknown kind; relokv::error for a bad budget
  [[nodiscard]] relokv::recompute::any_strategy make() const;
};

/// A strategy an engine serves by name: the QA program's variants and relokv_server's
/// --strategy and relokv.strategy share this one table.
struct named_strategy {
  std::string key;   ///< short name: full, prefix, naive, block, epic, kvboost, cacheblend, ...
  std::string name;  ///< what the tables print
  std::string note;
  strategy_spec spec;
  bool spans = true;  ///< false: the whole prompt is one prefix (exact keys only)
};
/// The twelve named strategies, reference first (first_k: EPIC's and the seam's k; topk:
/// CacheBlend's share).
std::vector<named_strategy> strategy_table(std::int32_t first_k = 16, float topk = 0.15f);

/// The result of calibrating a model (relokv_rag --calibrate): the cheapest strategy whose
/// first-token KL and answer agreement with full recompute stayed within the thresholds on the
/// calibration set, or none (safe = false: serve this model with full recompute).
struct strategy_profile {
  std::string model;  ///< general.name of the GGUF
  std::string arch;
  std::int32_t n_layers = 0;
  double max_kl = 0.05, min_agreement = 0.8;
  bool safe = false;
  strategy_spec strategy;
  double work = 1.0;  ///< prefill work of the chosen strategy, a fraction of full's
  double kl = 0, agreement = 1;
  /// Kinds none of whose budgets passed: unsafe for this model.
  std::vector<std::string> unsafe_kinds;
  std::string calibration_set;
  std::int32_t questions = 0;
  /// Per-request escalation to full recompute served with the strategy (never, unless the
  /// calibration chose one), and what it measured on the held-out half of the calibration set.
  relokv::recompute::escalation_policy escalation{};
  double escalated = 0;  ///< the share of held-out requests it escalated
  /// When the chosen variant read a span-link adapter: its identity (link_adapter::id, hex)
  /// and file name. Serving the profile needs that adapter (--links).
  std::string links_id, links_file;
};

/// @throws std::runtime_error naming the file and the field that is missing or malformed
strategy_profile load_profile(const std::string& path);
void save_profile(const std::string& path, const strategy_profile& p);
/// The strategy to serve `m` with under profile `p`: p.strategy when safe, else full
/// recompute. @throws std::runtime_error when the profile was made for another model
/// @throws std::runtime_error when the profile was made for another model, or with a span-link
/// adapter `m` does not carry
relokv::recompute::any_strategy profile_strategy(const strategy_profile& p, const llama_model& m);
/// A span-link adapter's identity as profiles write it: 16 hex digits.
std::string link_id_text(const link_adapter& a);

}  // namespace relokv_engine
