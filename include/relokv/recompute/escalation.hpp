#pragma once
/// @file
/// Per-request escalation to full recompute: a cheap strategy serves every request, and the
/// few whose next-token distribution looks unsure are recomputed in full, before their first
/// token or at the answer step where the doubt appears. What the policy reads is the
/// distribution the engine already has: no extra forward pass.
///
/// The signal and its threshold are calibrated per model (relokv_rag --calibrate: the least
/// mean work that keeps a target agreement with full recompute on held-out questions). An
/// escalation before the first token costs the cheap attempt plus a full prefill; one mid-answer
/// costs a full prefill of the prompt plus one decode step per token already produced, and
/// cannot take back the tokens already sent: it makes the rest of the answer full recompute's
/// continuation of what was sent.
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN
namespace recompute {

/// What a policy reads of one next-token distribution (softmax of the logits).
struct logit_summary {
  float margin = 1.0f;   ///< p(top-1) - p(top-2), in [0, 1]
  float entropy = 0.0f;  ///< in nats
  std::int32_t argmax = -1;
};

/// The softmax's top-1 margin and entropy of `logits`. @throws relokv::error for an empty
/// vector or a non-finite logit (a broken forward pass is not a confident one).
[[nodiscard]] inline logit_summary summarize_logits(std::span<const float> logits) {
  if (logits.empty()) throw error("summarize_logits: no logits");
  float top1 = -std::numeric_limits<float>::infinity(), top2 = top1;
  std::int32_t arg = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (!std::isfinite(x))
      throw error("summarize_logits: logit " + std::to_string(i) + " is not finite");
    if (x > top1) {
      top2 = top1;
      top1 = x;
      arg = static_cast<std::int32_t>(i);
    } else if (x > top2) {
      top2 = x;
    }
  }
  double z = 0, ent = 0;
  for (const float x : logits) z += std::exp(double(x) - top1);
  const double logz = std::log(z);
  for (const float x : logits) {
    const double lp = double(x) - top1 - logz;
    ent -= std::exp(lp) * lp;
  }
  logit_summary s;
  s.argmax = arg;
  const double p1 = 1.0 / z;
  const double p2 = logits.size() > 1 ? std::exp(double(top2) - top1) / z : 0.0;
  s.margin = static_cast<float>(p1 - p2);
  s.entropy = static_cast<float>(std::max(ent, 0.0));
  return s;
}

/// Which summary a policy compares with its threshold.
enum class escalation_signal : std::uint8_t {
  top1_margin,  ///< escalate when the margin is below the threshold
  entropy,      ///< escalate when the entropy is above the threshold
};
/// When a policy looks.
enum class escalation_stage : std::uint8_t {
  first_token,  ///< once, before the first token is chosen
  every_token,  ///< before each answer token, until it escalates once
  /// Once, after a whole draft answer is generated and held back: the draft's least sure step
  /// decides (the caller passes that step's summary), and an escalated request's answer is
  /// full recompute's from its first token. Nothing is sent before the check, so the time to
  /// first token includes the draft.
  draft,
};

[[nodiscard]] constexpr std::string_view to_string(escalation_signal s) noexcept {
  return s == escalation_signal::top1_margin ? "margin" : "entropy";
}
[[nodiscard]] constexpr std::string_view to_string(escalation_stage s) noexcept {
  return s == escalation_stage::first_token   ? "first"
         : s == escalation_stage::every_token ? "every"
                                              : "draft";
}

/// A per-request escalation policy. The default never escalates.
struct escalation_policy {
  bool enabled = false;
  escalation_signal signal = escalation_signal::top1_margin;
  escalation_stage stage = escalation_stage::first_token;
  float threshold = 0.0f;

  /// Whether the distribution summarized by `s`, before answer token `step` (0: the first),
  /// calls for full recompute. For the draft stage, `s` is the draft's least sure step (see
  /// worst()) and `step` is not read.
  [[nodiscard]] constexpr bool escalate(const logit_summary& s, std::int32_t step) const noexcept {
    if (!enabled || (stage == escalation_stage::first_token && step > 0)) return false;
    return signal == escalation_signal::top1_margin ? s.margin < threshold : s.entropy > threshold;
  }
  /// The less sure of two summaries under this policy's signal (a draft's running worst).
  [[nodiscard]] constexpr logit_summary worst(const logit_summary& a,
                                              const logit_summary& b) const noexcept {
    return signal == escalation_signal::top1_margin ? (b.margin < a.margin ? b : a)
                                                    : (b.entropy > a.entropy ? b : a);
  }
  /// @throws relokv::error for a threshold outside the signal's range (a margin in [0, 1], an
  /// entropy >= 0) or not finite.
  void validate() const {
    if (!enabled) return;
    const bool ok = std::isfinite(threshold) && (signal == escalation_signal::top1_margin
                                                     ? threshold >= 0.0f && threshold <= 1.0f
                                                     : threshold >= 0.0f);
    if (!ok)
      throw error("escalation_policy: threshold " + std::to_string(threshold) + " is outside " +
                  (signal == escalation_signal::top1_margin ? "[0, 1] (a margin)"
                                                            : "[0, inf) (an entropy)"));
  }
  /// "margin<0.3@first", "entropy>1.2@every", "margin<0.2@draft", or "never".
  [[nodiscard]] std::string label() const {
    if (!enabled) return "never";
    const bool m = signal == escalation_signal::top1_margin;
    std::string t = std::to_string(threshold);
    t.erase(t.find_last_not_of('0') + 1);
    if (!t.empty() && t.back() == '.') t.pop_back();
    return std::string(to_string(signal)) + (m ? "<" : ">") + t + "@" +
           std::string(to_string(stage));
  }
  /// Parses label()'s form: SIGNAL<T or SIGNAL>T, then @first, @every or @draft (default
  /// @first).
  /// @throws relokv::error naming what is wrong
  [[nodiscard]] static escalation_policy parse(std::string_view text) {
    const auto bad = [&](const char* why) {
      return error("escalation policy '" + std::string(text) + "': " + why +
                   " (expected margin<T or entropy>T, then @first, @every or @draft)");
    };
    escalation_policy p;
    if (text == "never") return p;
    p.enabled = true;
    std::string_view rest = text;
    if (const auto at = rest.find('@'); at != std::string_view::npos) {
      const auto st = rest.substr(at + 1);
      if (st == "first")
        p.stage = escalation_stage::first_token;
      else if (st == "every")
        p.stage = escalation_stage::every_token;
      else if (st == "draft")
        p.stage = escalation_stage::draft;
      else
        throw bad("unknown stage");
      rest = rest.substr(0, at);
    }
    if (rest.starts_with("margin<")) {
      p.signal = escalation_signal::top1_margin;
      rest.remove_prefix(7);
    } else if (rest.starts_with("entropy>")) {
      p.signal = escalation_signal::entropy;
      rest.remove_prefix(8);
    } else {
      throw bad("unknown signal");
    }
    const std::string num(rest);
    std::size_t used = 0;
    try {
      p.threshold = std::stof(num, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (num.empty() || used != num.size()) throw bad("the threshold is not a number");
    p.validate();
    return p;
  }
};

}  // namespace recompute
RELOKV_NAMESPACE_END
