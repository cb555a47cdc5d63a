// relokv_rag: multi-document QA that runs every PIC variant side by side in one cache.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "load_model.hpp"
#include "model_path.hpp"
#include "rag.hpp"

namespace {

void usage() {
  std::printf(R"(usage: relokv_rag [options]

Runs a multi-document QA workload under every position-independent caching variant, all
served by ONE relocatable_cache with their requests interleaved, and compares each with full
recompute: TTFT (p50/p95), prefill tokens computed, exact and relocated hit rates, requests per
second, KV memory, KL divergence of the first token's distribution, agreement of the greedy
answer, and token F1 against the gold answers.

Workload
  --data PATH       2WikiMultihopQA-style JSONL (question, answer, context as
                    [[title, [sentences]], ...]); default: the built-in generator
  --requests N      questions to run (default 24)
  --passages K      generator: passages per question (default 10)
  --corpus N        generator: passages in the corpus (default 40)
  --zipf S          generator: Zipf exponent of passage popularity (default 1.0)
  --seed N          seed for passage order and the generator (default 1)
Model
  --model PATH      GGUF Llama model; "auto" takes $RELOKV_MODEL or the scripts/get-model
                    cache (default: the built-in synthetic model, which runs offline)
  --placement P     pre_rotated, at_attention or block_relative (default)
  --max-answer N    greedy answer tokens (default 16)
  --first-k N       EPIC's recomputed tokens per span, and KVBoost's seam window (default 16,
                    at most 32)
  --topk R          CacheBlend's recompute ratio in [0, 1] (default 0.15)
  --variants LIST   comma-separated subset of full, prefix, naive, block, epic, kvboost,
                    cacheblend, union (default: all); full always runs first, as the reference
Output
  --json FILE       results as JSON     --csv FILE   results as CSV
  --svg FILE        plot: TTFT against agreement per variant, tokens computed per request
  --quiet           no progress bar
)");
}

std::string fmt(double v, int prec = 2) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}
double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

struct row {
  std::string name, note;
  double p50, p95, computed, exact, reloc, rps, kv_mib, kl, agree, f1;
};

std::vector<row> rows_of(const std::vector<relokv_rag::variant_result>& res) {
  std::vector<row> out;
  for (const auto& r : res) {
    const double blocks = r.blocks ? double(r.blocks) : 1.0;
    out.push_back({r.name, r.note, relokv_rag::percentile(r.ttft_ms, 50),
                   relokv_rag::percentile(r.ttft_ms, 95), mean(r.computed),
                   100.0 * double(r.exact) / blocks, 100.0 * double(r.relocated) / blocks,
                   r.busy_s > 0 ? double(r.ttft_ms.size()) / r.busy_s : 0,
                   double(r.peak_kv_bytes) / (1 << 20), mean(r.kl), 100.0 * mean(r.agreement),
                   100.0 * mean(r.f1)});
  }
  return out;
}

void write_svg(const std::string& path, const std::vector<row>& rows,
               const std::vector<relokv_rag::variant_result>& res) {
  std::ofstream o(path);
  const double W = 900, H = 420, pw = 400, ph = 300, x0 = 60, y0 = 50, x1 = 520;
  double tmax = 1e-9;
  for (const auto& r : rows) tmax = std::max(tmax, r.p50);
  const char* colors[] = {"#222", "#888", "#d62728", "#ff7f0e", "#2ca02c", "#1f77b4", "#9467bd"};
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' font-size='11'>\n<rect width='100%' height='100%' "
       "fill='white'/>\n";
  o << "<text x='" << x0
    << "' y='25' font-size='14'>TTFT p50 (ms) vs agreement with full "
       "recompute (%)</text>\n";
  o << "<rect x='" << x0 << "' y='" << y0 << "' width='" << pw << "' height='" << ph
    << "' fill='none' stroke='#999'/>\n";
  for (int t = 0; t <= 4; ++t) {
    const double y = y0 + ph - ph * t / 4.0;
    o << "<text x='" << x0 - 30 << "' y='" << y + 4 << "'>" << t * 25 << "</text>\n";
    const double x = x0 + pw * t / 4.0;
    o << "<text x='" << x - 10 << "' y='" << y0 + ph + 16 << "'>" << fmt(tmax * 1.1 * t / 4, 0)
      << "</text>\n";
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double x = x0 + pw * rows[i].p50 / (tmax * 1.1), y = y0 + ph - ph * rows[i].agree / 100;
    o << "<circle cx='" << x << "' cy='" << y << "' r='5' fill='" << colors[i % 7] << "'/>\n";
    o << "<text x='" << x + 7 << "' y='" << y - 6 - 11.0 * double(i % 3) << "' fill='"
      << colors[i % 7] << "'>" << rows[i].name << "</text>\n";
  }
  // Tokens computed per request, one polyline per variant.
  o << "<text x='" << x1 << "' y='25' font-size='14'>prefill tokens computed per request</text>\n";
  o << "<rect x='" << x1 << "' y='" << y0 << "' width='" << 340 << "' height='" << ph
    << "' fill='none' stroke='#999'/>\n";
  double cmax = 1;
  std::size_t n = 1;
  for (const auto& r : res) {
    for (double c : r.computed) cmax = std::max(cmax, c);
    n = std::max(n, r.computed.size());
  }
  for (std::size_t v = 0; v < res.size(); ++v) {
    o << "<polyline fill='none' stroke='" << colors[v % 7] << "' points='";
    for (std::size_t i = 0; i < res[v].computed.size(); ++i)
      o << x1 + 340.0 * double(i) / double(std::max<std::size_t>(n - 1, 1)) << ","
        << y0 + ph - ph * res[v].computed[i] / cmax << " ";
    o << "'/>\n";
  }
  o << "<text x='" << x1 << "' y='" << y0 + ph + 16 << "'>request</text><text x='" << x1 - 40
    << "' y='" << y0 + 10 << "'>" << fmt(cmax, 0) << "</text>\n</svg>\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::string data, model_path, json_out, csv_out, svg_out;
  std::size_t requests = 24, passages = 10, corpus = 40;
  double zipf = 1.0;
  std::uint32_t seed = 1;
  bool quiet = false;
  std::string variant_list;
  std::int32_t first_k = 16;
  float topk = 0.15f;
  relokv_rag::run_options opt;
  auto need = [&](int& i) -> std::string {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "relokv_rag: %s needs a value (see --help)\n", argv[i]);
      std::exit(2);
    }
    return argv[++i];
  };
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        usage();
        return 0;
      } else if (a == "--data")
        data = need(i);
      else if (a == "--requests")
        requests = std::stoul(need(i));
      else if (a == "--passages")
        passages = std::stoul(need(i));
      else if (a == "--corpus")
        corpus = std::stoul(need(i));
      else if (a == "--zipf")
        zipf = std::stod(need(i));
      else if (a == "--seed")
        seed = static_cast<std::uint32_t>(std::stoul(need(i)));
      else if (a == "--model") {
        model_path = need(i);
        if (model_path == "auto") {
          model_path = relokv_engine::default_model_path();
          if (model_path.empty()) {
            std::fprintf(stderr, "relokv_rag: --model auto: no model; run scripts/get-model\n");
            return 2;
          }
        }
      } else if (a == "--synthetic")
        model_path.clear();
      else if (a == "--placement")
        opt.placement = need(i);
      else if (a == "--max-answer")
        opt.max_answer = std::stoi(need(i));
      else if (a == "--json")
        json_out = need(i);
      else if (a == "--csv")
        csv_out = need(i);
      else if (a == "--svg")
        svg_out = need(i);
      else if (a == "--quiet")
        quiet = true;
      else if (a == "--variants")
        variant_list = need(i);
      else if (a == "--first-k")
        first_k = std::stoi(need(i));
      else if (a == "--topk")
        topk = std::stof(need(i));
      else {
        std::fprintf(stderr, "relokv_rag: unknown option '%s' (see --help)\n", a.c_str());
        return 2;
      }
    }
  } catch (const std::exception&) {
    std::fprintf(stderr, "relokv_rag: a numeric option has a bad value (see --help)\n");
    return 2;
  }
  try {
    const auto loaded = relokv_engine::load_model(model_path);
    const auto& model = loaded.model;
    relokv_rag::text_codec codec{loaded.tokenizer.get(), model->cfg.vocab};
    const auto w = data.empty() ? relokv_rag::generate(requests, corpus, passages, zipf, seed,
                                                       model->cfg.vocab)
                                : relokv_rag::load_jsonl(data, requests, seed, codec);
    std::printf("relokv_rag: %zu requests from %s, %zu passages, model %s, placement %s\n",
                w.requests.size(), w.source.c_str(), w.corpus.size(),
                model_path.empty() ? "synthetic (offline)" : model_path.c_str(),
                opt.placement.c_str());
    if (!quiet)
      opt.progress = [](std::size_t d, std::size_t t) {
        const int width = 30, filled = static_cast<int>(double(width) * double(d) / double(t));
        std::fprintf(stderr, "\r[%s%s] %zu/%zu",
                     std::string(static_cast<std::size_t>(filled), '=').c_str(),
                     std::string(static_cast<std::size_t>(width - filled), ' ').c_str(), d, t);
        if (d == t) std::fprintf(stderr, "\n");
      };
    auto variants = relokv_rag::default_variants(first_k, topk);
    if (!variant_list.empty()) {
      // variants[0] ("full") is the reference and always kept.
      std::vector<bool> keep(variants.size(), false);
      keep[0] = true;
      std::stringstream list(variant_list);
      for (std::string item; std::getline(list, item, ',');) {
        std::size_t k = 0;
        while (k < variants.size() && item != variants[k].key) ++k;
        if (k == variants.size()) {
          std::fprintf(stderr, "relokv_rag: --variants: unknown variant '%s' (see --help)\n",
                       item.c_str());
          return 2;
        }
        keep[k] = true;
      }
      std::vector<relokv_rag::variant> chosen;
      for (std::size_t k = 0; k < variants.size(); ++k)
        if (keep[k]) chosen.push_back(variants[k]);
      variants = std::move(chosen);
    }
    const auto res = relokv_rag::run(model, w, codec, variants, opt);
    const auto rows = rows_of(res);
    std::printf("\n%-28s %9s %9s %9s %7s %7s %7s %8s %8s %7s %6s\n", "variant", "TTFT p50",
                "TTFT p95", "computed", "exact%", "reloc%", "req/s", "KV MiB", "KL", "agree%",
                "F1%");
    for (const auto& r : rows)
      std::printf("%-28s %7.1fms %7.1fms %9.1f %7.1f %7.1f %7.2f %8.1f %8.4f %7.1f %6.1f\n",
                  r.name.c_str(), r.p50, r.p95, r.computed, r.exact, r.reloc, r.rps, r.kv_mib, r.kl,
                  r.agree, r.f1);
    std::printf("\nTTFT speedup over full prefill:");
    for (std::size_t i = 1; i < rows.size(); ++i)
      std::printf(" %s %.1fx;", rows[i].name.c_str(), rows[0].p50 / rows[i].p50);
    std::printf("\n");
    for (const auto& r : rows)
      if (!r.note.empty()) std::printf("  %s: %s\n", r.name.c_str(), r.note.c_str());
    if (!loaded.tokenizer)
      std::printf(
          "  synthetic model: F1 against the generator's answers means nothing (random "
          "weights); KL and agreement compare the variants\n");
    if (!csv_out.empty()) {
      std::ofstream o(csv_out);
      o << "variant,ttft_p50_ms,ttft_p95_ms,tokens_computed,exact_hit_pct,relocated_hit_pct,"
           "requests_per_s,kv_mib,kl,agreement_pct,f1_pct\n";
      for (const auto& r : rows)
        o << '"' << r.name << "\"," << r.p50 << ',' << r.p95 << ',' << r.computed << ',' << r.exact
          << ',' << r.reloc << ',' << r.rps << ',' << r.kv_mib << ',' << r.kl << ',' << r.agree
          << ',' << r.f1 << '\n';
    }
    if (!json_out.empty()) {
      nlohmann::json doc = {{"source", w.source},
                            {"requests", w.requests.size()},
                            {"placement", opt.placement},
                            {"variants", nlohmann::json::array()}};
      for (const auto& r : rows)
        doc["variants"].push_back({{"name", r.name},
                                   {"ttft_p50_ms", r.p50},
                                   {"ttft_p95_ms", r.p95},
                                   {"tokens_computed", r.computed},
                                   {"exact_hit_pct", r.exact},
                                   {"relocated_hit_pct", r.reloc},
                                   {"requests_per_s", r.rps},
                                   {"kv_mib", r.kv_mib},
                                   {"kl", r.kl},
                                   {"agreement_pct", r.agree},
                                   {"f1_pct", r.f1}});
      std::ofstream o(json_out);
      o << doc.dump(1) << "\n";
      if (!o) throw std::runtime_error(json_out + ": cannot write");
    }
    if (!svg_out.empty()) write_svg(svg_out, rows, res);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relokv_rag: %s\n", e.what());
    return 1;
  }
}
