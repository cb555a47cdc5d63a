// Per-request escalation, measured (see escalation.hpp).
#include "escalation_study.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace relokv_rag {

namespace {

using relokv::recompute::escalation_signal;
using relokv::recompute::escalation_stage;
constexpr double kInf = std::numeric_limits<double>::infinity();

double mean_of(const std::vector<double>& v, const std::vector<std::size_t>& idx) {
  double s = 0;
  for (std::size_t i : idx) s += v[i];
  return idx.empty() ? 0.0 : s / double(idx.size());
}

/// A step's risk under an every-token signal.
double step_risk(const variant_result& v, const signal_def& s, std::size_t req, std::size_t j) {
  return s.signal == escalation_signal::top1_margin ? -v.step_margins[req][j]
                                                    : v.step_entropies[req][j];
}

/// The first answer step whose risk exceeds t, or -1.
std::int64_t first_step_over(const variant_result& v, const signal_def& s, std::size_t req,
                             double t) {
  for (std::size_t j = 0; j < v.step_margins[req].size(); ++j)
    if (step_risk(v, s, req, j) > t) return static_cast<std::int64_t>(j);
  return -1;
}

bool has_signals(const variant_result& v) {
  return !v.margin0.empty() && v.margin0.size() == v.agreement.size() &&
         std::none_of(v.escalated.begin(), v.escalated.end(), [](double e) { return e > 0; });
}

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

std::string threshold_text(const signal_def& s, double t) {
  if (t == kInf) return "never";
  return policy_of(s, t).label();
}

}  // namespace

double roc_auc(const std::vector<double>& score, const std::vector<bool>& positive) {
  std::vector<std::pair<double, bool>> v;
  for (std::size_t i = 0; i < score.size() && i < positive.size(); ++i)
    v.emplace_back(score[i], positive[i]);
  std::sort(v.begin(), v.end());
  double pos = 0, neg = 0, rank_sum = 0;
  for (std::size_t i = 0; i < v.size();) {
    std::size_t j = i;
    while (j < v.size() && v[j].first == v[i].first) ++j;
    const double mid_rank = (double(i) + double(j - 1)) / 2.0 + 1.0;  // ties: the mean rank
    for (std::size_t k = i; k < j; ++k) {
      if (v[k].second) {
        rank_sum += mid_rank;
        ++pos;
      } else {
        ++neg;
      }
    }
    i = j;
  }
  if (pos == 0 || neg == 0) return 0.5;
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

std::vector<signal_def> escalation_signals() {
  return {{"margin0", escalation_signal::top1_margin, escalation_stage::first_token},
          {"entropy0", escalation_signal::entropy, escalation_stage::first_token},
          {"margin_every", escalation_signal::top1_margin, escalation_stage::every_token},
          {"entropy_every", escalation_signal::entropy, escalation_stage::every_token},
          {"margin_draft", escalation_signal::top1_margin, escalation_stage::draft},
          {"entropy_draft", escalation_signal::entropy, escalation_stage::draft},
          {"naive_kl", escalation_signal::entropy, escalation_stage::first_token, false},
          {"oracle", escalation_signal::entropy, escalation_stage::first_token, false}};
}

std::vector<double> risk_of(const variant_result& v, const signal_def& s) {
  std::vector<double> r;
  for (std::size_t i = 0; i < v.margin0.size(); ++i) {
    if (s.name == "naive_kl")
      r.push_back(v.naive_kl[i]);
    else if (s.name == "oracle")  // foresight: the worst answers first (a bound, not a policy)
      r.push_back(1.0 - v.agreement[i]);
    else if (s.stage == escalation_stage::first_token)
      r.push_back(s.signal == escalation_signal::top1_margin ? -v.margin0[i] : v.entropy0[i]);
    else
      r.push_back(s.signal == escalation_signal::top1_margin ? -v.min_margin[i] : v.max_entropy[i]);
  }
  return r;
}

escalation_outcome simulate(const variant_result& v, const signal_def& s, double threshold,
                            const std::vector<std::size_t>& requests) {
  escalation_outcome o;
  o.threshold = threshold;
  if (requests.empty()) return o;
  const auto risk = risk_of(v, s);
  double esc = 0, agree = 0, work = 0, late = 0;
  for (std::size_t k : requests) {
    std::int64_t at = -1;
    if (s.stage == escalation_stage::every_token)
      at = first_step_over(v, s, k, threshold);
    else  // before the first token, or after the draft (then replaced whole)
      at = risk[k] > threshold ? 0 : -1;
    if (at < 0) {
      agree += v.agreement[k];
      work += v.work[k];
      continue;
    }
    ++esc;
    // The first attempt, full recompute's prefill, and the answer so far fed back.
    work += v.work[k] + 1.0 + double(at) / double(std::max(v.prompt_tokens[k], 1));
    const double d = v.diverged_at[k];
    if (d < 0 || double(at) <= d) {
      agree += 1.0;  // the answer so far is full's: the rest is full's too
    } else {
      agree += v.agreement[k];
      ++late;
    }
  }
  const double n = double(requests.size());
  o.escalated = esc / n;
  o.agreement = agree / n;
  o.work = work / n;
  o.late = late / n;
  return o;
}

std::vector<escalation_outcome> escalation_curve(const variant_result& v, const signal_def& s,
                                                 const std::vector<std::size_t>& requests) {
  std::vector<double> ts = {kInf, -kInf};
  if (s.stage != escalation_stage::every_token) {
    const auto risk = risk_of(v, s);
    for (std::size_t k : requests) ts.push_back(risk[k]);
  } else {
    for (std::size_t k : requests)
      for (std::size_t j = 0; j < v.step_margins[k].size(); ++j)
        ts.push_back(step_risk(v, s, k, j));
  }
  std::sort(ts.begin(), ts.end());
  ts.erase(std::unique(ts.begin(), ts.end()), ts.end());
  std::vector<escalation_outcome> out;
  for (double t : ts) out.push_back(simulate(v, s, t, requests));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.work != b.work ? a.work < b.work : a.threshold > b.threshold;
  });
  return out;
}

std::optional<escalation_outcome> fit_threshold(const variant_result& v, const signal_def& s,
                                                double target,
                                                const std::vector<std::size_t>& requests) {
  for (const auto& o : escalation_curve(v, s, requests))
    if (o.agreement >= target - 1e-12) return o;  // by work: the first that reaches it
  return std::nullopt;
}

relokv::recompute::escalation_policy policy_of(const signal_def& s, double threshold) {
  relokv::recompute::escalation_policy p;
  if (threshold == kInf) return p;
  p.enabled = true;
  p.signal = s.signal;
  p.stage = s.stage;
  if (s.signal == escalation_signal::top1_margin)
    // risk = -margin > t  <=>  margin < -t; escalating everything: margin < 1 (all but
    // certain tokens).
    p.threshold = static_cast<float>(std::clamp(-threshold, 0.0, 1.0));
  else
    p.threshold = static_cast<float>(std::max(threshold, 0.0));
  return p;
}

std::vector<std::size_t> split_half(std::size_t n, bool held_out) {
  std::vector<std::size_t> idx;
  for (std::size_t i = held_out ? 1 : 0; i < n; i += 2) idx.push_back(i);
  return idx;
}

std::optional<escalation_choice> choose_escalation(const std::vector<variant_result>& res,
                                                   double target, bool use_split) {
  std::optional<escalation_choice> best;
  for (std::size_t vi = 1; vi < res.size(); ++vi) {
    const auto& v = res[vi];
    if (!has_signals(v)) continue;
    const std::size_t n = v.agreement.size();
    std::vector<std::size_t> all(n);
    for (std::size_t i = 0; i < n; ++i) all[i] = i;
    const auto fit_on = use_split ? split_half(n, false) : all;
    const auto held = use_split ? split_half(n, true) : all;
    for (const auto& s : escalation_signals()) {
      if (!s.engine_policy) continue;
      const auto f = fit_threshold(v, s, target, fit_on);
      if (!f || f->work >= 1.0) continue;
      if (best && best->fit.work <= f->work) continue;
      best = escalation_choice{vi, s, *f, simulate(v, s, f->threshold, held)};
    }
  }
  return best;
}

escalation_study run_escalation_study(std::shared_ptr<const relokv_engine::llama_model> model,
                                      const workload& w, const text_codec& codec,
                                      const std::vector<variant>& variants, const run_options& opt,
                                      double target) {
  escalation_study st;
  auto o = opt;
  o.noise_floor = false;
  st.res = run(model, w, codec, variants, o);
  st.target = target;
  st.choice = choose_escalation(st.res, target, /*use_split=*/true);
  if (!st.choice) return st;
  workload held = w;
  held.requests.clear();
  for (std::size_t i : split_half(w.requests.size(), /*held_out=*/true))
    held.requests.push_back(w.requests[i]);
  auto esc = variants[st.choice->variant];
  esc.escalation = policy_of(st.choice->signal, st.choice->fit.threshold);
  esc.name += " + " + esc.escalation.label();
  esc.key += "+esc";
  st.engine_run = run(model, held, codec, {variants[0], esc}, o);
  return st;
}

std::vector<std::pair<std::string, double>> escalation_figures(const escalation_study& s) {
  std::vector<std::pair<std::string, double>> out;
  // The least work any policy could reach the target with, over the bases, held out.
  double bound = 1e9;
  const auto held = split_half(s.res[0].agreement.size(), true);
  for (std::size_t vi = 1; vi < s.res.size(); ++vi)
    if (has_signals(s.res[vi]))
      if (const auto o = fit_threshold(s.res[vi], escalation_signals().back(), s.target, held))
        bound = std::min(bound, o->work);
  if (bound < 1e9) out.emplace_back("rag_escalation_oracle_work", bound);
  if (!s.choice || s.engine_run.size() < 2) {
    out.emplace_back("rag_escalation_chosen", 0);
    return out;
  }
  const auto& f = s.engine_run[0];
  const auto& e = s.engine_run[1];
  std::vector<std::size_t> idx(e.agreement.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  const double ttft_e = mean_of(e.ttft_ms, idx);
  out.emplace_back("rag_escalation_chosen", 1);
  out.emplace_back("rag_escalation_agreement", mean_of(e.agreement, idx));
  out.emplace_back("rag_escalation_work", mean_of(e.work, idx));
  out.emplace_back("rag_escalation_escalated", mean_of(e.escalated, idx));
  out.emplace_back("rag_escalation_ttft_speedup",
                   ttft_e > 0 ? mean_of(f.ttft_ms, idx) / ttft_e : 0);
  out.emplace_back("rag_escalation_teacher_forced", mean_of(e.tf_agreement, idx));
  out.emplace_back("rag_escalation_simulated_agreement", s.choice->held_out.agreement);
  out.emplace_back("rag_escalation_simulated_work", s.choice->held_out.work);
  const auto& base = s.res[s.choice->variant];

  std::vector<bool> diverged;
  for (double d : base.diverged_at) diverged.push_back(d >= 0);
  for (const auto& sig : escalation_signals()) {
    const auto risk = risk_of(base, sig);
    if (sig.name == "oracle") continue;
    if (sig.name == "naive_kl" &&
        std::any_of(risk.begin(), risk.end(), [](double x) { return x < 0; }))
      continue;
    out.emplace_back("rag_escalation_auc_" + sig.name, roc_auc(risk, diverged));
  }
  return out;
}

void write_escalation_study(const std::string& prefix, const std::string& model,
                            const std::vector<variant_result>& res, double target,
                            const std::optional<escalation_choice>& choice,
                            const std::vector<variant_result>& engine_run) {
  if (res.empty()) throw std::invalid_argument("escalation study: no results");
  const std::size_t n = res[0].agreement.size();
  const auto fit = split_half(n, false), held = split_half(n, true);
  std::vector<std::size_t> all(n);
  for (std::size_t i = 0; i < n; ++i) all[i] = i;
  nlohmann::json doc = {{"model", model},
                        {"questions", n},
                        {"target_agreement", target},
                        {"split", "fit: even-numbered questions, held out: odd-numbered"}};
  std::string md = "# Escalation study: " + model + ", " + std::to_string(n) +
                   " questions\n\nThresholds fitted on the even-numbered questions (" +
                   std::to_string(fit.size()) + "), reported on the odd-numbered (" +
                   std::to_string(held.size()) + "). Target agreement " +
                   fmt("%.0f%%", 100 * target) +
                   ". `work%` counts every prefill token-layer: the first attempt, full "
                   "recompute's prefill and the answer tokens fed back.\n\n";
  // Signals.
  md +=
      "## How well each signal predicts that the answer leaves full recompute's\n\n"
      "ROC AUC over all questions (0.5: no better than chance); `identical%`: answers equal to "
      "full recompute's token for token.\n\n| base strategy | work% | agreement% | "
      "teacher-forced% | F1 / full's F1 | identical% |";
  const auto sigs = escalation_signals();
  for (const auto& s : sigs)
    if (s.name != "oracle") md += " " + s.name + " |";
  md += "\n|---|---|---|---|---|---|";
  for (std::size_t i = 0; i + 1 < sigs.size(); ++i) md += "---|";
  md += "\n";
  nlohmann::json jsig = nlohmann::json::array();
  for (std::size_t vi = 1; vi < res.size(); ++vi) {
    const auto& v = res[vi];
    if (!has_signals(v)) continue;
    std::vector<bool> diverged;
    for (double d : v.diverged_at) diverged.push_back(d >= 0);
    const double identical =
        double(std::count(diverged.begin(), diverged.end(), false)) / double(diverged.size());
    const auto tf = bootstrap_mean(v.tf_agreement);
    const auto f1 = bootstrap_ratio(v.f1, res[0].f1);
    md += "| " + v.name + " | " + fmt("%.1f", 100 * mean_of(v.work, all)) + " | " +
          fmt("%.1f", 100 * mean_of(v.agreement, all)) + " | " + fmt("%.1f", 100 * tf.mean) +
          fmt(" [%.1f, ", 100 * tf.lo) + fmt("%.1f]", 100 * tf.hi) + " | " + fmt("%.2f", f1.mean) +
          fmt(" [%.2f, ", f1.lo) + fmt("%.2f]", f1.hi) + " | " + fmt("%.1f", 100 * identical) +
          " |";
    nlohmann::json row = {{"variant", v.name},
                          {"work", mean_of(v.work, all)},
                          {"agreement", mean_of(v.agreement, all)},
                          {"teacher_forced", {{"mean", tf.mean}, {"lo", tf.lo}, {"hi", tf.hi}}},
                          {"f1_over_full", {{"mean", f1.mean}, {"lo", f1.lo}, {"hi", f1.hi}}},
                          {"identical", identical}};
    for (const auto& s : sigs) {
      if (s.name == "oracle") continue;
      const auto risk = risk_of(v, s);
      const bool usable = std::none_of(risk.begin(), risk.end(), [](double x) { return x < 0; }) ||
                          s.name != "naive_kl";
      const double auc = usable ? roc_auc(risk, diverged) : -1;
      md += usable ? fmt(" %.3f |", auc) : std::string(" - |");
      row["auc"][s.name] = auc;
    }
    md += "\n";
    jsig.push_back(row);
  }
  doc["signals"] = jsig;
  // Every request's signals and outcome, per base strategy: the raw material for another
  // analysis (the threshold of another target, another split).
  nlohmann::json jreq = nlohmann::json::array();
  for (std::size_t vi = 1; vi < res.size(); ++vi) {
    const auto& v = res[vi];
    if (!has_signals(v)) continue;
    jreq.push_back({{"variant", v.name},
                    {"agreement", v.agreement},
                    {"diverged_at", v.diverged_at},
                    {"work", v.work},
                    {"prompt_tokens", v.prompt_tokens},
                    {"margin0", v.margin0},
                    {"entropy0", v.entropy0},
                    {"step_margins", v.step_margins},
                    {"step_entropies", v.step_entropies},
                    {"naive_kl", v.naive_kl},
                    {"tf_agreement", v.tf_agreement},
                    {"f1", v.f1}});
  }
  doc["requests"] = {{"full_f1", res[0].f1}, {"variants", jreq}};
  // Policies.
  md +=
      "\n## Each base strategy and signal fitted for the target\n\nThe least-work threshold "
      "whose agreement reaches the target on the fit half, then the same threshold on the "
      "held-out half. `late`: escalated after the answer had already left full's (its "
      "agreement is then the first attempt's: an estimate).\n\n| base strategy | signal | "
      "policy | fit: agreement% | fit: work% | held out: agreement% | held out: work% | "
      "escalated% | late% |\n|---|---|---|---|---|---|---|---|---|\n";
  nlohmann::json jpol = nlohmann::json::array();
  for (std::size_t vi = 1; vi < res.size(); ++vi) {
    const auto& v = res[vi];
    if (!has_signals(v)) continue;
    for (const auto& s : sigs) {
      if (!s.engine_policy) continue;
      const auto f = fit_threshold(v, s, target, fit);
      if (!f) {
        md += "| " + v.name + " | " + s.name + " | none reaches it | | | | | | |\n";
        continue;
      }
      const auto h = simulate(v, s, f->threshold, held);
      md += "| " + v.name + " | " + s.name + " | " + threshold_text(s, f->threshold) + " | " +
            fmt("%.1f", 100 * f->agreement) + " | " + fmt("%.1f", 100 * f->work) + " | " +
            fmt("%.1f", 100 * h.agreement) + " | " + fmt("%.1f", 100 * h.work) + " | " +
            fmt("%.1f", 100 * h.escalated) + " | " + fmt("%.1f", 100 * h.late) + " |\n";
      jpol.push_back({{"variant", v.name},
                      {"signal", s.name},
                      {"policy", threshold_text(s, f->threshold)},
                      {"fit", {{"agreement", f->agreement}, {"work", f->work}}},
                      {"held_out",
                       {{"agreement", h.agreement},
                        {"work", h.work},
                        {"escalated", h.escalated},
                        {"late", h.late}}}});
    }
  }
  // The bound: a perfect predictor (escalating the least agreeing answers first) on the
  // held-out half. No signal does better; where it misses the goal, so does every policy.
  md +=
      "\n## The bound: escalation with foresight\n\nEscalating the held-out requests in "
      "order of their answers' disagreement with full recompute (what a perfect signal would "
      "do): the least mean work that reaches the target. No policy can do better.\n\n| "
      "base strategy | work% for the target | escalated% |\n|---|---|---|\n";
  nlohmann::json jor = nlohmann::json::array();
  const signal_def oracle = sigs.back();
  for (std::size_t vi = 1; vi < res.size(); ++vi) {
    const auto& v = res[vi];
    if (!has_signals(v)) continue;
    const auto o = fit_threshold(v, oracle, target, held);
    md += "| " + v.name + " | " + (o ? fmt("%.1f", 100 * o->work) : std::string("-")) + " | " +
          (o ? fmt("%.1f", 100 * o->escalated) : std::string("-")) + " |\n";
    jor.push_back(
        {{"variant", v.name}, {"work", o ? o->work : 0.0}, {"escalated", o ? o->escalated : 0.0}});
  }
  doc["oracle_bound"] = jor;
  doc["policies"] = jpol;
  if (choice) {
    const auto& v = res[choice->variant];
    md += "\n## Chosen (least work on the fit half)\n\n**" + v.name + " + " +
          threshold_text(choice->signal, choice->fit.threshold) + "**: held out " +
          fmt("%.1f%% agreement", 100 * choice->held_out.agreement) + " at " +
          fmt("%.1f%% work", 100 * choice->held_out.work) + " (" +
          fmt("%.1f%% of requests escalated", 100 * choice->held_out.escalated) + ").\n";
    doc["chosen"] = {{"variant", v.name},
                     {"policy", threshold_text(choice->signal, choice->fit.threshold)},
                     {"held_out",
                      {{"agreement", choice->held_out.agreement},
                       {"work", choice->held_out.work},
                       {"escalated", choice->held_out.escalated}}}};
  } else {
    md +=
        "\n## Chosen\n\nNone: no base strategy and signal reached the target on the fit half "
        "below full recompute's work.\n";
    doc["chosen"] = nullptr;
  }
  if (engine_run.size() >= 2) {
    const auto& f = engine_run[0];
    const auto& e = engine_run[1];
    std::vector<std::size_t> idx(e.agreement.size());
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    const auto ag = bootstrap_mean(e.agreement), tf = bootstrap_mean(e.tf_agreement);
    const auto f1 = bootstrap_ratio(e.f1, f.f1);
    const double ttft_full = mean_of(f.ttft_ms, idx), ttft_esc = mean_of(e.ttft_ms, idx);
    md +=
        "\n## The chosen policy in the engine loop, on the held-out questions\n\nRun, not "
        "simulated: the cheap attempt, the escalations and their full prefills, beside full "
        "recompute in one engine.\n\n| | agreement% | teacher-forced% | F1 / full's F1 | "
        "work% | escalated% | mean TTFT ms |\n|---|---|---|---|---|---|---|\n";
    md += "| full recompute | 100 | 100 | 1.00 | 100 | - | " + fmt("%.1f", ttft_full) + " |\n";
    md += "| " + e.name + " | " + fmt("%.1f", 100 * ag.mean) + fmt(" [%.1f, ", 100 * ag.lo) +
          fmt("%.1f]", 100 * ag.hi) + " | " + fmt("%.1f", 100 * tf.mean) + " | " +
          fmt("%.2f", f1.mean) + fmt(" [%.2f, ", f1.lo) + fmt("%.2f]", f1.hi) + " | " +
          fmt("%.1f", 100 * mean_of(e.work, idx)) + " | " +
          fmt("%.1f", 100 * mean_of(e.escalated, idx)) + " | " + fmt("%.1f", ttft_esc) + " |\n";
    doc["engine_run"] = {{"variant", e.name},
                         {"questions", idx.size()},
                         {"agreement", {{"mean", ag.mean}, {"lo", ag.lo}, {"hi", ag.hi}}},
                         {"teacher_forced", tf.mean},
                         {"f1_over_full", f1.mean},
                         {"work", mean_of(e.work, idx)},
                         {"escalated", mean_of(e.escalated, idx)},
                         {"ttft_ms_full", ttft_full},
                         {"ttft_ms", ttft_esc},
                         {"ttft_speedup", ttft_esc > 0 ? ttft_full / ttft_esc : 0.0}};
  }
  // The curves: agreement against mean work on the held-out half, one per base and signal.
  const double W = 720, H = 420, L = 60, R = 280, T = 40, B = 50;
  const auto x = [&](double work) { return L + (W - L - R) * std::min(work, 1.2) / 1.2; };
  const auto y = [&](double a) { return T + (H - T - B) * (1.0 - a); };
  std::string svg =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", W) + "\" height=\"" +
      fmt("%.0f", H) + "\" font-family=\"sans-serif\" font-size=\"11\">\n<text x=\"" +
      fmt("%.0f", L) + "\" y=\"20\" font-size=\"13\">" + model +
      ": agreement with full recompute against mean work, held-out questions</text>\n";
  for (int g = 0; g <= 6; ++g) {
    const double wv = 0.2 * g;
    svg += "<line x1=\"" + fmt("%.1f", x(wv)) + "\" y1=\"" + fmt("%.1f", y(0)) + "\" x2=\"" +
           fmt("%.1f", x(wv)) + "\" y2=\"" + fmt("%.1f", y(1)) +
           "\" stroke=\"#ddd\"/>\n<text x=\"" + fmt("%.1f", x(wv) - 10) + "\" y=\"" +
           fmt("%.1f", H - B + 15) + "\">" + fmt("%.0f%%", 100 * wv) + "</text>\n";
  }
  for (int g = 0; g <= 5; ++g) {
    const double av = 0.2 * g;
    svg += "<line x1=\"" + fmt("%.1f", L) + "\" y1=\"" + fmt("%.1f", y(av)) + "\" x2=\"" +
           fmt("%.1f", W - R) + "\" y2=\"" + fmt("%.1f", y(av)) +
           "\" stroke=\"#ddd\"/>\n<text x=\"20\" y=\"" + fmt("%.1f", y(av) + 4) + "\">" +
           fmt("%.0f%%", 100 * av) + "</text>\n";
  }
  svg += "<text x=\"" + fmt("%.0f", (W - R) / 2) + "\" y=\"" + fmt("%.0f", H - 10) +
         "\">mean prefill work (% of full recompute)</text>\n";
  svg += "<line x1=\"" + fmt("%.1f", L) + "\" y1=\"" + fmt("%.1f", y(target)) + "\" x2=\"" +
         fmt("%.1f", W - R) + "\" y2=\"" + fmt("%.1f", y(target)) +
         "\" stroke=\"#c00\" stroke-dasharray=\"4 3\"/>\n";
  const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
                          "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#d62728"};
  int line = 0;
  for (std::size_t vi = 1; vi < res.size(); ++vi) {
    const auto& v = res[vi];
    if (!has_signals(v)) continue;
    for (const auto& s : sigs) {
      if (!s.engine_policy || s.stage == escalation_stage::every_token) continue;
      const auto curve = escalation_curve(v, s, held);
      // The upper envelope: agreement never falls as work grows.
      std::string pts;
      double best_a = -1;
      for (const auto& o : curve) {
        if (o.agreement <= best_a) continue;
        best_a = o.agreement;
        pts += fmt("%.1f,", x(o.work)) + fmt("%.1f ", y(o.agreement));
      }
      const char* c = colors[line % 10];
      svg += "<polyline fill=\"none\" stroke=\"" + std::string(c) + "\" points=\"" + pts +
             "\"/>\n<text x=\"" + fmt("%.0f", W - R + 8) + "\" y=\"" +
             fmt("%.0f", T + 14.0 * line) + "\" fill=\"" + c + "\">" + v.name + " + " + s.name +
             "</text>\n";
      ++line;
    }
  }
  if (choice)
    svg += "<circle cx=\"" + fmt("%.1f", x(choice->held_out.work)) + "\" cy=\"" +
           fmt("%.1f", y(choice->held_out.agreement)) +
           "\" r=\"5\" fill=\"none\" stroke=\"#000\"/>\n";
  svg += "</svg>\n";
  const auto write = [](const std::string& path, const std::string& text) {
    std::ofstream o(path);
    o << text;
    if (!o) throw std::runtime_error(path + ": cannot write");
  };
  write(prefix + ".md", md);
  write(prefix + ".svg", svg);
  write(prefix + ".json", doc.dump(1) + "\n");
}

}  // namespace relokv_rag
