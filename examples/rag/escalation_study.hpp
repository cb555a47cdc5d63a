#pragma once
// Per-request escalation, measured: how well each cheap signal tells the requests whose answer
// will leave full recompute's from those whose answer will not (ROC AUC), what agreement each
// threshold buys at what mean work, thresholds fitted on one half of the questions and reported
// on the other, and the policy chosen for a target agreement (relokv_rag --escalation and
// --calibrate). The policy itself is relokv/recompute/escalation.hpp; the engine loop that
// applies it is run_engine.cpp.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <relokv/recompute/escalation.hpp>

#include "rag.hpp"

namespace relokv_rag {

/// The area under the ROC curve of `score` as a predictor of `positive` (the Mann-Whitney
/// statistic; ties count half). 0.5 when either class is empty.
double roc_auc(const std::vector<double>& score, const std::vector<bool>& positive);

/// A signal a policy can read, and how: first-token (margin0, entropy0, naive_kl), every
/// answer token (margin_every, entropy_every: escalate mid-answer), or a draft answer's least
/// sure step (margin_draft, entropy_draft: the draft held back, then sent or replaced); last,
/// "oracle": foresight of each answer's disagreement, the bound no policy can beat.
struct signal_def {
  std::string name;
  relokv::recompute::escalation_signal signal;
  relokv::recompute::escalation_stage stage;
  bool engine_policy = true;  ///< false: measured only (naive_kl needs a second prefill)
};
std::vector<signal_def> escalation_signals();

/// Each request's risk under a signal (larger: more likely to diverge); for the every-token
/// signals, the worst step of the answer.
std::vector<double> risk_of(const variant_result& v, const signal_def& s);

/// A policy's outcome on a set of requests of one variant: share escalated, mean agreement
/// (escalated requests take full recompute's answer from the escalation step on), mean work
/// (the first attempt, the full prefill and the answer tokens fed back all count), and
/// teacher-forced agreement.
struct escalation_outcome {
  double threshold = 0;  ///< on the risk scale; +inf: never escalate
  double escalated = 0, agreement = 0, work = 0;
  /// Requests escalated after they had already left full's answer: their agreement is the
  /// first attempt's (an estimate: the engine-loop run measures it exactly).
  double late = 0;
};
/// The outcome of escalating, among `requests` (indices), those whose risk exceeds
/// `threshold`. An every-token signal escalates at the first step whose risk exceeds it.
escalation_outcome simulate(const variant_result& v, const signal_def& s, double threshold,
                            const std::vector<std::size_t>& requests);
/// Every distinct threshold's outcome on `requests`, never escalating first, by work.
std::vector<escalation_outcome> escalation_curve(const variant_result& v, const signal_def& s,
                                                 const std::vector<std::size_t>& requests);
/// The least-work threshold whose agreement on `requests` reaches `target`, or none.
std::optional<escalation_outcome> fit_threshold(const variant_result& v, const signal_def& s,
                                                double target,
                                                const std::vector<std::size_t>& requests);
/// The engine's policy for a signal at a threshold on the risk scale.
relokv::recompute::escalation_policy policy_of(const signal_def& s, double threshold);

/// The requests of a split: even indices fit, odd ones are held out.
std::vector<std::size_t> split_half(std::size_t n, bool held_out);

/// A strategy with a policy, chosen for a target agreement at the least mean work.
struct escalation_choice {
  std::size_t variant = 0;  ///< into the results
  signal_def signal;
  escalation_outcome fit, held_out;
};
/// The least-work (variant, signal, threshold) whose agreement on the fit half reaches
/// `target`, reported on the held-out half; none when every choice costs full recompute's work
/// or more. Variant 0 is the reference; variants without per-request signals are skipped.
std::optional<escalation_choice> choose_escalation(const std::vector<variant_result>& res,
                                                   double target, bool use_split);

/// The study: `variants` (full recompute first) on every question of `w`, a policy chosen for
/// `target` on the even-numbered questions, then run in the engine loop on the odd-numbered ones
/// beside full recompute.
struct escalation_study {
  std::vector<variant_result> res;
  std::optional<escalation_choice> choice;
  std::vector<variant_result> engine_run;  ///< [full, chosen + policy] on the held-out half
  double target = 0.95;
};
escalation_study run_escalation_study(std::shared_ptr<const relokv_engine::llama_model> model,
                                      const workload& w, const text_codec& codec,
                                      const std::vector<variant>& variants, const run_options& opt,
                                      double target);
/// relokv_report's lines: rag_escalation_agreement, _work, _escalated and _ttft_speedup (the
/// chosen policy run on the held-out questions; absent without a choice), the held-out
/// simulation's agreement and work beside them, and each signal's ROC AUC on the chosen base
/// (rag_escalation_auc_<signal>), and rag_escalation_oracle_work: the least mean work with
/// which a perfect predictor reaches the target on the held-out half, over the bases.
std::vector<std::pair<std::string, double>> escalation_figures(const escalation_study& s);

/// relokv_rag --escalation PREFIX: the study's tables (PREFIX.md), curves (PREFIX.svg, agreement
/// against mean work on the held-out half) and numbers (PREFIX.json). `engine_run` is the
/// chosen policy run in the engine loop on the held-out questions, with full recompute as its
/// row 0, when there was a choice.
void write_escalation_study(const std::string& prefix, const std::string& model,
                            const std::vector<variant_result>& res, double target,
                            const std::optional<escalation_choice>& choice,
                            const std::vector<variant_result>& engine_run);

}  // namespace relokv_rag
