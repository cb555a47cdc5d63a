// relokv_teacher: the span-link trainer's teacher (tools/links), computed once by relokv's own
// engine and cached to disk. For each prompt of a prompt set (tools/links/corpus.py: passages of
// an exported workload and a question), the whole prompt under full recompute, then `--answer`
// greedy tokens (the end-of-turn token does not stop it: the rows after it are still the full
// prompt's distribution), and at each row that predicts an answer token the `--top` largest
// log-probabilities. One JSON line per prompt (its index `i`; each run appends its prompts in
// index order); a run that was stopped resumes with the prompts it has not written. `--only`
// answers a subset (the prompts a training run uses: `distill.py --selection`), in a fraction of
// the time of the whole set.
//
//   relokv_teacher --model M.gguf --workload wl.json --prompts p.json --out teacher.jsonl
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <relokv/layout/builder.hpp>
#include <relokv/recompute/full.hpp>
#include <relokv/rope/block_relative.hpp>

#include "llama_engine.hpp"
#include "load_model.hpp"

namespace {

/// The `top` largest log-probabilities of `logits` (ids and values, largest first).
void top_logp(const std::vector<float>& logits, std::size_t top, nlohmann::json& ids,
              nlohmann::json& lps) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float z : logits) sum += std::exp(static_cast<double>(z - mx));
  const double lse = static_cast<double>(mx) + std::log(sum);
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  top = std::min(top, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(top), order.end(),
                    [&](std::int32_t a, std::int32_t b) {
                      return logits[static_cast<std::size_t>(a)] >
                             logits[static_cast<std::size_t>(b)];
                    });
  nlohmann::json i = nlohmann::json::array(), l = nlohmann::json::array();
  for (std::size_t j = 0; j < top; ++j) {
    const auto t = static_cast<std::size_t>(order[j]);
    i.push_back(order[j]);
    l.push_back(std::round((static_cast<double>(logits[t]) - lse) * 1e4) / 1e4);
  }
  ids.push_back(std::move(i));
  lps.push_back(std::move(l));
}

/// The prompts an earlier run answered: its complete lines are kept (a line cut short by a stop
/// is dropped, and that prompt computed again).
std::set<std::size_t> resume(const std::string& path) {
  std::vector<std::string> keep;
  std::set<std::size_t> done;
  {
    std::ifstream in(path);
    if (!in) return done;
    std::size_t line = 0;
    for (std::string s; std::getline(in, s);) {
      ++line;
      if (s.empty() || s.back() != '}') continue;
      const auto j = nlohmann::json::parse(s, nullptr, false);
      if (j.is_discarded() || !j.contains("i") || !j["i"].is_number_unsigned())
        throw std::runtime_error(path + ":" + std::to_string(line) +
                                 ": not a teacher line (a JSON object with its prompt index i)");
      done.insert(j["i"].get<std::size_t>());
      keep.push_back(std::move(s));
    }
  }
  std::ofstream rewrite(path, std::ios::trunc);
  for (const auto& s : keep) rewrite << s << '\n';
  return done;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"relokv_teacher: full-recompute answers and log-probs for the link trainer"};
  std::string model_path, workload, prompts, out_path, only_path;
  std::int32_t answer = 32;
  std::size_t top = 32;
  app.add_option("--model", model_path, "GGUF model")->required()->check(CLI::ExistingFile);
  app.add_option("--workload", workload, "relokv_rag --export-workload's JSON")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--prompts", prompts, "tools/links/corpus.py's prompt set")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--out", out_path, "JSON lines, one per prompt (resumed when it exists)")
      ->required();
  app.add_option("--answer", answer, "greedy answer tokens per prompt")->check(CLI::Range(1, 512));
  app.add_option("--top", top, "log-probabilities kept per row")->check(CLI::Range(1, 1024));
  app.add_option("--only", only_path,
                 "a JSON array of the prompt indices to answer (default: every prompt): "
                 "distill.py --selection writes the ones a run trains and validates on")
      ->check(CLI::ExistingFile);
  CLI11_PARSE(app, argc, argv);
  try {
    const auto model = relokv_engine::load_model(model_path).model;
    std::ifstream win(workload), pin(prompts);
    const auto w = nlohmann::json::parse(win);
    const auto p = nlohmann::json::parse(pin);
    const auto prefix = w.at("prefix").get<std::vector<relokv::token_t>>();
    const auto& corpus = w.at("corpus");
    const auto& items = p.at("prompts");
    std::vector<std::size_t> todo;
    if (only_path.empty()) {
      todo.resize(items.size());
      std::iota(todo.begin(), todo.end(), std::size_t{0});
    } else {
      std::ifstream oin(only_path);
      const auto only = nlohmann::json::parse(oin);
      if (!only.is_array()) throw std::runtime_error("--only: not a JSON array of prompt indices");
      for (const auto& x : only) {
        if (!x.is_number_unsigned() || x.get<std::size_t>() >= items.size())
          throw std::runtime_error("--only: " + x.dump() + " is not a prompt index (the set has " +
                                   std::to_string(items.size()) + ")");
        todo.push_back(x.get<std::size_t>());
      }
      std::sort(todo.begin(), todo.end());
      todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
    }
    const auto done = resume(out_path);
    std::erase_if(todo, [&](std::size_t i) { return done.count(i) > 0; });
    std::ofstream out(out_path, std::ios::app);
    relokv_engine::llama_engine<relokv::block_relative, relokv::bf16> eng(model, 1024);
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t n = 0; n < todo.size(); ++n) {
      const std::size_t i = todo[n];
      std::vector<relokv::token_t> all = prefix;
      for (const auto& ix : items[i].at("passages")) {
        const auto d = corpus.at(ix.get<std::size_t>()).at("tokens");
        for (const auto& t : d) all.push_back(t.get<relokv::token_t>());
      }
      for (const auto& t : items[i].at("question_tokens")) all.push_back(t.get<relokv::token_t>());
      auto logits = eng.prefill(relokv::layout_builder(16, model->cfg.vocab).prefix(all).build(),
                                relokv::recompute::full{});
      nlohmann::json ids = nlohmann::json::array(), lps = nlohmann::json::array(),
                     ans = nlohmann::json::array();
      for (std::int32_t j = 0; j < answer; ++j) {
        top_logp(logits, top, ids, lps);
        const auto t = static_cast<relokv::token_t>(std::max_element(logits.begin(), logits.end()) -
                                                    logits.begin());
        ans.push_back(t);
        if (j + 1 < answer) logits = eng.decode(t);
      }
      eng.end(false);
      out << nlohmann::json{{"i", i},
                            {"prompt_tokens", all.size()},
                            {"answer", ans},
                            {"top_ids", ids},
                            {"top_logp", lps}}
                 .dump()
          << '\n'
          << std::flush;
      if ((n + 1) % 50 == 0)
        std::fprintf(stderr, "relokv_teacher: %zu/%zu (%.0f s)\n", n + 1, todo.size(),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relokv_teacher: %s\n", e.what());
    return 1;
  }
}
