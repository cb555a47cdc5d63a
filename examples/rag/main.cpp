// relokv_rag: multi-document QA that runs every PIC variant side by side in one cache, measures
// each against full recompute (with bootstrap intervals), sweeps the strategies' budgets, and
// calibrates which strategy a model can be served with.
#include <spawn.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <relokv/store/any_store.hpp>
#include <relokv/store/store_url.hpp>

#include "escalation_study.hpp"
#include "load_model.hpp"
#include "model_path.hpp"
#include "options.hpp"
#include "rag.hpp"
#include "report.hpp"
#include "store_mode.hpp"
#include "window_study.hpp"

extern char** environ;

namespace {

using relokv_rag::options;

std::string resolve_model(const std::string& m) {
  if (m.empty() || m.find('/') != std::string::npos || m.ends_with(".gguf")) return m;
  const std::string name = m == "auto" ? "smollm2" : m;
  const std::string p = relokv_engine::default_model_path(name);
  if (p.empty()) throw std::runtime_error("--model " + m + ": run scripts/get-model " + name);
  return p;
}

std::vector<relokv_rag::variant> pick(std::vector<relokv_rag::variant> all,
                                      const std::string& list) {
  std::vector<std::string> keys;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) keys.push_back(item);
  try {
    return relokv_rag::pick_variants(std::move(all), keys);
  } catch (const relokv::error& e) {
    throw std::runtime_error(std::string("--variants: ") + e.what());
  }
}

/// The cheapest swept strategy within the thresholds; kinds none of whose budgets passed are
/// unsafe for this model.
relokv_engine::strategy_profile calibrate(const std::vector<relokv_rag::variant>& vars,
                                          const std::vector<relokv_rag::row>& rows,
                                          const std::vector<relokv_rag::variant_result>& res,
                                          const relokv_engine::llama_model& m, const options& o,
                                          const std::string& source) {
  relokv_engine::strategy_profile p;
  p.model = m.cfg.name;
  p.arch = m.cfg.arch;
  p.n_layers = m.cfg.n_layers;
  p.max_kl = o.max_kl;
  p.min_agreement = o.min_agreement;
  p.calibration_set = source;
  p.questions = static_cast<std::int32_t>(o.requests);
  std::vector<std::string> kinds, passed;
  std::size_t chosen = 0;  // the variant the profile serves
  for (std::size_t i = 1; i < vars.size(); ++i) {
    const auto& spec = vars[i].spec;
    if (std::find(kinds.begin(), kinds.end(), spec.kind) == kinds.end()) kinds.push_back(spec.kind);
    const bool ok = rows[i].kl.mean <= o.max_kl && rows[i].agree.mean / 100 >= o.min_agreement;
    if (!ok) continue;
    if (std::find(passed.begin(), passed.end(), spec.kind) == passed.end())
      passed.push_back(spec.kind);
    if (!p.safe || rows[i].work / 100 < p.work) {
      p.safe = true;
      chosen = i;
      p.strategy = spec;
      p.work = rows[i].work / 100;
      p.kl = rows[i].kl.mean;
      p.agreement = rows[i].agree.mean / 100;
    }
  }
  // A strategy with an escalation threshold, for the agreement alone (an escalated request's
  // first token is full recompute's: KL 0), fitted on half the questions and measured on the
  // other half; chosen when it costs less work than the cheapest plain strategy.
  if (const auto c = relokv_rag::choose_escalation(res, o.min_agreement, /*use_split=*/true);
      c && (!p.safe || c->held_out.work < p.work)) {
    const auto& v = res[c->variant];
    p.safe = true;
    chosen = c->variant;
    p.strategy = vars[c->variant].spec;
    p.escalation = relokv_rag::policy_of(c->signal, c->fit.threshold);
    p.work = c->held_out.work;
    p.agreement = c->held_out.agreement;
    p.escalated = c->held_out.escalated;
    std::vector<double> kl;
    for (std::size_t i = 1; i < v.kl.size(); i += 2) kl.push_back(v.kl[i]);
    p.kl = relokv_rag::bootstrap_mean(kl).mean;  // the first attempt's, before escalation
    std::erase(p.unsafe_kinds, p.strategy.kind);
  }
  for (const auto& k : kinds)
    if (std::find(passed.begin(), passed.end(), k) == passed.end() &&
        !(p.escalation.enabled && k == p.strategy.kind))
      p.unsafe_kinds.push_back(k);
  if (!p.safe) p.strategy = {"full"};
  // The chosen variant reads the adapter: the profile names it, and serving it needs it.
  if (p.safe && vars[chosen].links && m.links) {
    p.links_id = relokv_engine::link_id_text(*m.links);
    p.links_file = std::filesystem::path(m.links->path).filename().string();
  }
  return p;
}

/// Runs this program again as the writer and waits for it.
int spawn_writer(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--role") {
      ++i;
      continue;
    }
    if (a.rfind("--role=", 0) == 0) continue;
    args.push_back(a);
  }
  args.push_back("--role");
  args.push_back("writer");
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = 0;
  if (const int e = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargv.data(), environ))
    throw std::runtime_error(std::string("could not start the writer process: ") +
                             std::strerror(e));
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) throw std::runtime_error("waitpid on the writer failed");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int store_mode(int argc, char** argv, const options& o,
               std::shared_ptr<const relokv_engine::llama_model> model,
               const relokv_rag::workload& w, const relokv_rag::text_codec& codec) {
  // A URL the store refuses (a bad one, rediss:// without TLS) is an error here, at start-up,
  // before any process is spawned; nothing connects yet.
  relokv_rag::store_mode_options so;
  so.url = o.store;
  so.seal = {o.store_key_file, o.store_key_env};
  // The key too: a missing, unsafe or malformed key is an error now, never shown.
  (void)relokv::any_store::from_url(o.store, so.seal);
  so.placement = o.run.placement;
  so.max_answer = o.run.max_answer;
  so.engine = o.run.engine;
  so.model_path = o.run.model_path;
  const bool one_process = o.store == "memory:";
  if (one_process && o.role != "both")
    throw std::runtime_error("--store memory: lives in one process: use --role both");
  if (o.role == "writer" || one_process) {
    const auto wr = relokv_rag::run_writer(model, w, so);
    const auto& s = wr.stats;
    std::printf(
        "writer (pid %d): %zu passages cached in %.2f s; %lld blocks written to %s (%.1f MiB, "
        "%lld failed)\n",
        static_cast<int>(getpid()), wr.passages, wr.seconds, static_cast<long long>(s.store_writes),
        relokv::redact_url(o.store).c_str(), double(s.store_bytes_written) / (1 << 20),
        static_cast<long long>(s.store_write_failures));
    relokv_rag::print_nodes("written", wr.nodes);
    if (o.role == "writer") return 0;
  }
  if (o.role == "both" && !one_process) {
    std::fflush(stdout);
    if (const int rc = spawn_writer(argc, argv); rc != 0)
      throw std::runtime_error("the writer process failed (exit " + std::to_string(rc) + ")");
  }
  auto variants = pick(relokv_rag::default_variants(o.first_k, o.topk),
                       o.variants.empty() ? std::string("naive,epic") : o.variants);
  const auto rr = relokv_rag::run_reader(model, w, codec, variants, so);
  std::printf("\nreader (pid %d)", static_cast<int>(getpid()));
  relokv_rag::print_reader(rr,
                           relokv::redact_url(o.store) + (so.seal.enabled() ? " (sealed)" : ""));
  return 0;
}

/// A progress bar on stderr, redrawn as requests finish.
void progress_bar(std::size_t done, std::size_t total) {
  const int width = 30, filled = static_cast<int>(double(width) * double(done) / double(total));
  std::fprintf(stderr, "\r[%s%s] %zu/%zu",
               std::string(static_cast<std::size_t>(filled), '=').c_str(),
               std::string(static_cast<std::size_t>(width - filled), ' ').c_str(), done, total);
  if (done == total) std::fprintf(stderr, "\n");
}

/// The variants to run: the sweep's, or the chosen defaults, plus a profile's when given.
std::vector<relokv_rag::variant> variants_of(const options& o, bool sweeping,
                                             const relokv_engine::llama_model& model) {
  const bool llama = o.run.engine == "llama.cpp";
  auto variants =
      sweeping
          ? relokv_rag::sweep_variants()
          : pick(relokv_rag::default_variants(o.first_k, o.topk),
                 o.variants.empty() && llama ? std::string("prefix,naive,epic,seam") : o.variants);
  if (sweeping && llama)  // what runs through llama.cpp's API: the static strategies
    std::erase_if(variants, [](const relokv_rag::variant& v) {
      return v.strategy.dynamic() || v.strategy.probes() || v.strategy.grouped() != nullptr;
    });
  if (model.links) {
    for (auto& v : relokv_rag::link_variants(o.first_k, o.topk, sweeping)) {
      // llama.cpp reads the rows (llama_batch.embd) but has no hook between layers for the
      // question's attention.
      if (llama && (v.strategy.dynamic() || v.strategy.probes())) continue;
      if (("," + o.link_variants + ",").find("," + v.key + ",") == std::string::npos) continue;
      variants.push_back(std::move(v));
    }
  }
  if (!o.escalate.empty()) {
    const auto policy = relokv::recompute::escalation_policy::parse(o.escalate);
    const std::size_t n = variants.size();
    for (std::size_t i = 1; i < n; ++i) {
      if (variants[i].key == "prefix" || variants[i].spec.kind == "full") continue;
      auto e = variants[i];
      e.name += " + " + policy.label();
      e.key += "+esc";
      e.escalation = policy;
      variants.push_back(std::move(e));
    }
  }
  if (o.profile.empty()) return variants;
  const auto prof = relokv_engine::load_profile(o.profile);
  variants.push_back({"calibrated: " + (prof.safe ? prof.strategy.label() : "full (unsafe)") +
                          (prof.escalation.enabled ? " + " + prof.escalation.label() : ""),
                      relokv_engine::profile_strategy(prof, model), true, o.profile, "calibrated",
                      prof.safe ? prof.strategy : relokv_engine::strategy_spec{"full"},
                      prof.safe ? prof.escalation : relokv::recompute::escalation_policy{}});
  variants.back().links = prof.safe && !prof.links_id.empty();  // checked by profile_strategy
  if (!prof.safe)
    std::printf(
        "profile %s: no strategy met the thresholds on this model; serving it with full "
        "recompute\n",
        o.profile.c_str());
  return variants;
}

/// The files --csv, --json, --svg and --sweep ask for.
void write_outputs(const options& o, const std::vector<relokv_rag::variant>& variants,
                   const std::vector<relokv_rag::row>& rows,
                   const std::vector<relokv_rag::variant_result>& res,
                   const relokv_rag::workload& w, const std::string& model_name) {
  if (!o.csv_out.empty()) relokv_rag::write_csv(o.csv_out, rows);
  if (!o.json_out.empty())
    relokv_rag::write_json(o.json_out, rows, w.source, w.requests.size(), o.run.placement,
                           model_name);
  if (!o.svg_out.empty()) relokv_rag::write_svg(o.svg_out, rows, res);
  if (o.sweep_out.empty()) return;
  std::vector<relokv_rag::sweep_point> pts;
  for (std::size_t i = 1; i < rows.size(); ++i) {  // row 0 is the reference
    const auto& s = variants[i].spec;
    const double budget =
        s.kind == "deviation_topk" || s.kind == "question" ? 100.0 * s.ratio : double(s.k);
    pts.push_back({s.kind, s.label(), budget, rows[i]});
  }
  relokv_rag::write_sweep_csv(o.sweep_out + ".csv", pts, model_name);
  relokv_rag::write_sweep_svg(o.sweep_out + ".svg", pts,
                              model_name + ": accuracy against recompute, " +
                                  std::to_string(w.requests.size()) + " questions");
  std::printf("sweep: %s.csv, %s.svg\n", o.sweep_out.c_str(), o.sweep_out.c_str());
}

/// --escalation PREFIX: every base strategy with every signal on all the questions, the policy
/// chosen on half of them, then run in the engine loop on the other half.
int escalation_study(const options& o, std::shared_ptr<const relokv_engine::llama_model> model,
                     const relokv_rag::workload& w, const relokv_rag::text_codec& codec,
                     const std::string& model_name) {
  auto variants = pick(relokv_rag::default_variants(o.first_k, o.topk),
                       o.variants.empty() ? std::string("naive,epic,question") : o.variants);
  if (model->links)  // --links: the study considers the adapter's variants as bases too
    for (auto& v : relokv_rag::link_variants(o.first_k, o.topk, false))
      variants.push_back(std::move(v));
  const auto st =
      relokv_rag::run_escalation_study(model, w, codec, variants, o.run, o.target_agreement);
  relokv_rag::write_escalation_study(o.escalation_out, model_name, st.res, o.target_agreement,
                                     st.choice, st.engine_run);
  std::printf("escalation study: %s.md, %s.svg, %s.json\n", o.escalation_out.c_str(),
              o.escalation_out.c_str(), o.escalation_out.c_str());
  for (const auto& [name, value] : relokv_rag::escalation_figures(st))
    std::printf("%s %.3g\n", name.c_str(), value);
  if (st.engine_run.size() == 2)
    std::printf("chosen: %s (fitted on %zu questions, run on %zu)\n", st.engine_run[1].name.c_str(),
                relokv_rag::split_half(w.requests.size(), false).size(),
                st.engine_run[1].agreement.size());
  else
    std::printf(
        "no base strategy and signal reached agreement %.2f below full recompute's work on the "
        "fit half\n",
        o.target_agreement);
  return 0;
}

/// --calibrate: the cheapest strategy within the thresholds, saved as a profile.
void write_calibration(const options& o, const std::vector<relokv_rag::variant>& variants,
                       const std::vector<relokv_rag::row>& rows,
                       const std::vector<relokv_rag::variant_result>& res,
                       const relokv_engine::llama_model& model, const std::string& source) {
  const auto p = calibrate(variants, rows, res, model, o, source);
  relokv_engine::save_profile(o.calibrate_out, p);
  if (p.safe && p.escalation.enabled)
    std::printf(
        "calibration: %s escalating at %s (held out: work %.1f%%, agreement %.1f%%, %.1f%% of "
        "requests escalated) -> %s\n",
        p.strategy.label().c_str(), p.escalation.label().c_str(), 100 * p.work, 100 * p.agreement,
        100 * p.escalated, o.calibrate_out.c_str());
  else if (p.safe)
    std::printf("calibration: %s (work %.1f%%, first-token KL %.4f, agreement %.1f%%) -> %s\n",
                p.strategy.label().c_str(), 100 * p.work, p.kl, 100 * p.agreement,
                o.calibrate_out.c_str());
  else
    std::printf(
        "calibration: UNSAFE: no strategy kept KL <= %.3f and agreement >= %.0f%% on "
        "this model; the profile serves it with full recompute -> %s\n",
        o.max_kl, 100 * o.min_agreement, o.calibrate_out.c_str());
  for (const auto& k : p.unsafe_kinds)
    std::printf("  unsafe for this model at every budget tried: %s\n", k.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"relokv_rag"};
  options o;
  relokv_rag::add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  try {
    const std::string model_path = o.synthetic ? std::string() : resolve_model(o.model);
    const auto loaded = relokv_engine::load_model(model_path);
    auto model = loaded.model;
    if (!o.links.empty())
      model = relokv_engine::with_links(model, relokv_engine::load_links(o.links, *model));
    relokv_rag::text_codec codec{loaded.tokenizer.get(), model->cfg.vocab};
    // A real model reads the shipped sample unless told otherwise; the synthetic model (random
    // weights, no tokenizer) runs the generator unless given a file.
    std::string data = o.data;
    if (data.empty() && !o.generator && !model_path.empty()) data = relokv_rag::default_data();
    const auto w = data.empty() ? relokv_rag::generate(o.requests, o.corpus, o.passages, o.zipf,
                                                       o.seed, model->cfg.vocab)
                                : relokv_rag::load_jsonl(data, o.requests, o.seed, codec);
    if (!o.export_out.empty()) {
      relokv_rag::export_workload(o.export_out, w, codec);
      std::printf("relokv_rag: %zu requests, %zu passages -> %s\n", w.requests.size(),
                  w.corpus.size(), o.export_out.c_str());
      return 0;
    }
    const bool sweeping = !o.sweep_out.empty() || !o.calibrate_out.empty();
    o.run.model_path = model_path;
    const bool llama = o.run.engine == "llama.cpp";
    if (llama && !relokv_rag::has_llama_cpp())
      throw std::runtime_error(
          "--engine llama.cpp: this build has no llama.cpp (run scripts/get-llama-cpp and "
          "configure with -DRELOKV_WITH_LLAMA_CPP=ON; scripts/test does)");
    if (llama && model_path.empty())
      throw std::runtime_error("--engine llama.cpp needs a GGUF model (--model)");
    const std::string placement = llama ? "pre_rotated (llama.cpp's K-shift)" : o.run.placement;
    const std::string kv = llama ? (o.run.kv_dtype == "fp32" ? "f32" : "f16") : o.run.kv_dtype;
    std::printf(
        "relokv_rag: %zu requests from %s, %zu passages, model %s, engine %s, "
        "placement %s, KV %s%s\n",
        w.requests.size(), w.source.c_str(), w.corpus.size(),
        model_path.empty() ? "synthetic (offline)" : model_path.c_str(), o.run.engine.c_str(),
        placement.c_str(), kv.c_str(), sweeping ? ", budget sweep" : "");
    if (!o.quiet) o.run.progress = progress_bar;
    if (!o.store.empty()) return store_mode(argc, argv, o, model, w, codec);

    if (!o.layer_deviation_out.empty()) {
      const auto st = relokv_rag::run_deviation_study(
          model, w, o.requests, model_path.empty() ? "synthetic" : model->cfg.name);
      relokv_rag::write_deviation_study(o.layer_deviation_out, st);
      std::printf("layer deviation: %s.md, %s.json\n", o.layer_deviation_out.c_str(),
                  o.layer_deviation_out.c_str());
      return 0;
    }
    if (!o.escalation_out.empty())
      return escalation_study(o, model, w, codec,
                              model_path.empty() ? "synthetic" : model->cfg.name);
    const auto variants = variants_of(o, sweeping, *model);
    // The fp32-KV noise floor row beside the table (sweeps and calibration compare strategies
    // only, row by row with their variants).
    o.run.noise_floor = !sweeping;
    const auto res = relokv_rag::run(model, w, codec, variants, o.run);
    const auto rows = relokv_rag::rows_of(res);
    relokv_rag::print_summary(rows, /*synthetic=*/!loaded.tokenizer);
    write_outputs(o, variants, rows, res, w, model_path.empty() ? "synthetic" : model->cfg.name);
    if (!o.calibrate_out.empty()) write_calibration(o, variants, rows, res, *model, w.source);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relokv_rag: %s\n", e.what());
    return 1;
  }
}
