// Strategy specs and calibration profiles (see profile.hpp).
#include "strategy_profile.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace relokv_engine {

std::string strategy_spec::label() const {
  const std::string r = std::to_string(static_cast<int>(std::lround(100.0 * ratio))) + "%";
  if (kind == "first_k" || kind == "seam_window") return kind + " k=" + std::to_string(k);
  if (kind == "deviation_topk") return kind + " r=" + r;
  if (kind == "kvboost" || kind == "union") return kind + " k=" + std::to_string(k) + " r=" + r;
  if (kind == "question") return kind + (k > 0 ? " k=" + std::to_string(k) : "") + " r=" + r;
  if (kind == "ape") {
    char buf[64];
    std::snprintf(buf, sizeof buf, "ape T=%.2g S=%.2g", double(temperature), double(scale));
    return buf;
  }
  return kind;
}

relokv::recompute::any_strategy strategy_spec::make() const {
  namespace rc = relokv::recompute;
  if (kind == "none") return rc::none{};
  if (kind == "full") return rc::full{};
  if (kind == "first_k") return rc::first_k(k);
  if (kind == "seam_window") return rc::seam_window(k);
  if (kind == "kvboost") return rc::kvboost(k, ratio);
  if (kind == "deviation_topk") return rc::deviation_topk(ratio);
  if (kind == "union") return rc::first_k_and_topk(k, ratio);
  if (kind == "question") return rc::question_topk(ratio, k, from);
  if (kind == "ape") return rc::ape(temperature, scale);
  throw std::invalid_argument("unknown strategy kind '" + kind +
                              "' (none, full, first_k, seam_window, kvboost, deviation_topk, "
                              "union, question, ape)");
}

void save_profile(const std::string& path, const strategy_profile& p) {
  nlohmann::json doc = {
      {"format", "relokv-strategy-profile"},
      {"version", 1},
      {"model", p.model},
      {"arch", p.arch},
      {"n_layers", p.n_layers},
      {"thresholds", {{"max_first_token_kl", p.max_kl}, {"min_agreement", p.min_agreement}}},
      {"safe", p.safe},
      {"strategy",
       {{"kind", p.strategy.kind},
        {"k", p.strategy.k},
        {"ratio", p.strategy.ratio},
        {"temperature", p.strategy.temperature},
        {"scale", p.strategy.scale},
        {"from", p.strategy.from}}},
      {"measured", {{"work", p.work}, {"first_token_kl", p.kl}, {"agreement", p.agreement}}},
      {"unsafe_kinds", p.unsafe_kinds},
      {"calibration_set", {{"source", p.calibration_set}, {"questions", p.questions}}},
      {"escalation", {{"policy", p.escalation.label()}, {"escalated", p.escalated}}}};
  if (!p.links_id.empty()) doc["links"] = {{"id", p.links_id}, {"file", p.links_file}};
  std::ofstream o(path);
  o << doc.dump(1) << "\n";
  if (!o) throw std::runtime_error(path + ": cannot write");
}

strategy_profile load_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not JSON: " + e.what());
  }
  auto field = [&](const nlohmann::json& obj, const char* key, const std::string& where) {
    if (!obj.is_object() || !obj.contains(key))
      throw std::runtime_error(path + ": missing field '" + where + key + "'");
    return obj.at(key);
  };
  strategy_profile p;
  try {
    if (field(doc, "format", "") != "relokv-strategy-profile" || field(doc, "version", "") != 1)
      throw std::runtime_error(path + ": not a relokv strategy profile (format, version 1)");
    p.model = field(doc, "model", "").get<std::string>();
    p.arch = field(doc, "arch", "").get<std::string>();
    p.n_layers = field(doc, "n_layers", "").get<std::int32_t>();
    const auto th = field(doc, "thresholds", "");
    p.max_kl = field(th, "max_first_token_kl", "thresholds.").get<double>();
    p.min_agreement = field(th, "min_agreement", "thresholds.").get<double>();
    p.safe = field(doc, "safe", "").get<bool>();
    const auto st = field(doc, "strategy", "");
    p.strategy.kind = field(st, "kind", "strategy.").get<std::string>();
    p.strategy.k = field(st, "k", "strategy.").get<std::int32_t>();
    p.strategy.ratio = field(st, "ratio", "strategy.").get<float>();
    // APE's and question_topk's parameters (absent in profiles of other kinds' day: defaults)
    p.strategy.temperature = st.value("temperature", p.strategy.temperature);
    p.strategy.scale = st.value("scale", p.strategy.scale);
    p.strategy.from = st.value("from", p.strategy.from);
    const auto me = field(doc, "measured", "");
    p.work = field(me, "work", "measured.").get<double>();
    p.kl = field(me, "first_token_kl", "measured.").get<double>();
    p.agreement = field(me, "agreement", "measured.").get<double>();
    p.unsafe_kinds = field(doc, "unsafe_kinds", "").get<std::vector<std::string>>();
    const auto cs = field(doc, "calibration_set", "");
    p.calibration_set = field(cs, "source", "calibration_set.").get<std::string>();
    p.questions = field(cs, "questions", "calibration_set.").get<std::int32_t>();
    // Profiles written before escalation have none: never escalate.
    if (doc.contains("escalation")) {
      const auto es = field(doc, "escalation", "");
      try {
        p.escalation = relokv::recompute::escalation_policy::parse(
            field(es, "policy", "escalation.").get<std::string>());
      } catch (const relokv::error& e) {
        throw std::runtime_error(path + ": escalation.policy: " + e.what());
      }
      p.escalated = es.value("escalated", 0.0);
    }
    if (doc.contains("links")) {  // the variant chosen reads a span-link adapter
      const auto lk = field(doc, "links", "");
      p.links_id = field(lk, "id", "links.").get<std::string>();
      p.links_file = field(lk, "file", "links.").get<std::string>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": a field has the wrong type: " + e.what());
  }
  try {
    (void)p.strategy.make();  // an unknown kind or a bad budget fails here, not when serving
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": strategy: " + e.what());
  }
  return p;
}

relokv::recompute::any_strategy profile_strategy(const strategy_profile& p, const llama_model& m) {
  if (p.model != m.cfg.name || p.arch != m.cfg.arch || p.n_layers != m.cfg.n_layers)
    throw std::runtime_error("strategy profile is for model '" + p.model + "' (" + p.arch + ", " +
                             std::to_string(p.n_layers) + " layers), not '" + m.cfg.name + "' (" +
                             m.cfg.arch + ", " + std::to_string(m.cfg.n_layers) + " layers)");
  if (!p.safe) return relokv::recompute::full{};
  if (!p.links_id.empty() && (!m.links || link_id_text(*m.links) != p.links_id))
    throw std::runtime_error("strategy profile was calibrated with the span-link adapter " +
                             p.links_file + " (id " + p.links_id + "): serve it with --links " +
                             p.links_file);
  return p.strategy.make();
}

std::string link_id_text(const link_adapter& a) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(a.id));
  return buf;
}

std::vector<named_strategy> strategy_table(std::int32_t first_k, float topk) {
  const std::string k = std::to_string(first_k);
  const std::string r = std::to_string(static_cast<int>(std::lround(100.0 * topk)));
  auto v = [](std::string name, strategy_spec spec, bool spans, std::string note, std::string key) {
    return named_strategy{std::move(key), std::move(name), std::move(note), spec, spans};
  };
  return {
      v("full prefill (no cache)", {"full"}, false, "reference: the whole prompt, one segment",
        "full"),
      v("prefix caching (exact keys)", {"none"}, false, "vLLM-style", "prefix"),
      v("naive PIC", {"none"}, true, "", "naive"),
      v("Block-Attention", {"none"}, true, "question only; same compute as naive PIC here",
        "block"),
      v("EPIC first_k=" + k, {"first_k", first_k}, true, "", "epic"),
      v("KVBoost seam=" + k + " +" + r + "% cos", {"kvboost", first_k, topk}, true,
        "seam window + CacheBlend by cosine for approximate matches", "kvboost"),
      v("CacheBlend topk=" + r + "%", {"deviation_topk", 0, topk}, true, "", "cacheblend"),
      v("EPIC+CacheBlend k=" + k + " " + r + "%", {"union", first_k, topk}, true,
        "first k pinned, top-k at the check layer", "union"),
      v("Question-driven " + r + "%", {"question", 0, topk}, true,
        "A3/ProphetKV: the question's attention (deeper half) picks; probe counted", "question"),
      v("Question+EPIC k=2 12%", {"question", 2, 0.12f}, true,
        "first 2 of each span pinned, the question's top 12%", "qepic"),
      v("APE T=0.9 S=0.9", {"ape", 0, 0.0f, 0.9f, 0.9f}, true,
        "grouped attention at the question and answer; nothing recomputed", "ape"),
      v("seam window k=" + k, {"seam_window", first_k}, true,
        "KVBoost's window alone: the k tokens before each seam, no check layer", "seam"),
  };
}

}  // namespace relokv_engine
