#pragma once
// The QA job's loop over any relokv_engine::sequence_engine (its one-request loop: prefill,
// decode, end): relokv's own engine and relokv inside llama.cpp share it, so their tables mean
// the same. Internal to relokv_rag.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <relokv/layout/builder.hpp>
#include <relokv/recompute/escalation.hpp>
#include <relokv/recompute/full.hpp>
#include <relokv/recompute/none.hpp>

#include "rag.hpp"
#include "sequence.hpp"

namespace relokv_rag::detail {

/// Scores one answer against the reference's: first-token KL, the mean KL along the
/// reference's answer, greedy agreement (token by token, end-of-turn dropped), F1 and EM.
void score_answer(const std::vector<std::vector<float>>& ref_steps,
                  const std::vector<std::vector<float>>& steps,
                  const std::vector<relokv::token_t>& ref_answer,
                  const std::vector<relokv::token_t>& answer, relokv::token_t stop,
                  const qa_request& r, const text_codec& codec, variant_result& out);
/// The tokens passages are compiled behind for run_options::compile, or none for "prompt".
/// @throws std::invalid_argument for an unknown mode
std::optional<std::vector<relokv::token_t>> compile_context(const std::string& mode,
                                                            const workload& w);
/// The longest prompt of the workload, in tokens.
std::size_t longest_prompt(const workload& w);
/// run() on relokv inside llama.cpp (rag_llama_cpp.cpp; without llama.cpp in the build it
/// throws std::invalid_argument saying how to build it).
std::vector<variant_result> run_llama_cpp(std::shared_ptr<const relokv_engine::llama_model> model,
                                          const workload& w, const text_codec& codec,
                                          const std::vector<variant>& variants,
                                          const run_options& opt);

/// The keys' salt every request of a run carries (run_options::tenant).
inline relokv::extra_keys tenant_keys(const run_options& opt) {
  relokv::extra_keys k;
  k.tenant_salt = opt.tenant;
  return k;
}

/// The share of `ref_answer`'s tokens that the argmax of the logits before each one
/// (`steps`, fed full recompute's answer so far) matches.
inline double teacher_forced_agreement(const std::vector<std::vector<float>>& steps,
                                       const std::vector<relokv::token_t>& ref_answer) {
  std::size_t same = 0;
  for (std::size_t i = 0; i < ref_answer.size() && i < steps.size(); ++i)
    same += relokv_engine::argmax(steps[i]) == ref_answer[i];
  return double(same) / double(std::max<std::size_t>(ref_answer.size(), 1));
}

/// The engine a run measures, through the sequence interface alone (relokv's own engine and
/// relokv inside llama.cpp alike, so that their tables mean the same).
struct engine_under_test {
  relokv_engine::sequence_engine* eng = nullptr;
  /// The noise-floor row's engine (fp32 KV, full prefill), or none.
  relokv_engine::sequence_engine* floor = nullptr;
  /// The blocks the engine's pool holds now (the KV memory column).
  std::function<std::int64_t()> blocks_in_use;
  std::int32_t n_layers = 0;     ///< the work column's denominator
  std::int64_t block_bytes = 0;  ///< one block of every layer's K and V
};

/// Runs every request under every variant on `e.eng` (and the noise-floor row on `e.floor`,
/// when given). `adapter`: the span-link rows the links variants read.
/// @throws std::invalid_argument when a links variant has no adapter
std::vector<variant_result> run_engine(const engine_under_test& e, const workload& w,
                                       const text_codec& codec,
                                       const std::vector<variant>& variants, const run_options& opt,
                                       std::optional<relokv::link_rows> adapter = std::nullopt);

}  // namespace relokv_rag::detail
