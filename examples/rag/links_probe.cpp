// relokv_links_probe: the first answer token's logits of one request of an exported workload
// (relokv_rag --export-workload), as the engine serves it with span links: the passages compiled
// behind the system prompt, relocated in the request's order, the adapter's link rows before the
// question (strategy naive); and under full recompute. tests/links compares them with the
// trainer's forward (tools/links) on the same rows.
//
//   relokv_links_probe --model M.gguf --links A.gguf --workload wl.json --request 3
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <relokv/layout/builder.hpp>
#include <relokv/recompute/full.hpp>
#include <relokv/recompute/none.hpp>
#include <relokv/rope/block_relative.hpp>

#include "links.hpp"
#include "llama_engine.hpp"
#include "load_model.hpp"

int main(int argc, char** argv) {
  CLI::App app{"relokv_links_probe"};
  std::string model_path, links_path, workload;
  std::size_t request = 0;
  std::string kv = "bf16";
  app.add_option("--model", model_path, "GGUF model")->required()->check(CLI::ExistingFile);
  app.add_option("--links", links_path, "span-link adapter")->check(CLI::ExistingFile);
  app.add_option("--workload", workload, "relokv_rag --export-workload's JSON")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--request", request, "the request's index in the workload");
  app.add_option("--kv-dtype", kv, "bf16 or fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  CLI11_PARSE(app, argc, argv);
  try {
    auto model = relokv_engine::load_model(model_path).model;
    if (!links_path.empty())
      model = relokv_engine::with_links(model, relokv_engine::load_links(links_path, *model));
    std::ifstream in(workload);
    const auto w = nlohmann::json::parse(in);
    const auto& r = w.at("requests").at(request);
    const auto prefix = w.at("prefix").get<std::vector<relokv::token_t>>();
    std::vector<std::vector<relokv::token_t>> docs;
    for (const auto& p : r.at("passages"))
      docs.push_back(
          w.at("corpus").at(p.get<std::size_t>()).at("tokens").get<std::vector<relokv::token_t>>());
    const auto question = r.at("question_tokens").get<std::vector<relokv::token_t>>();
    const auto run = [&]<class T>(T*) {
      relokv_engine::llama_engine<relokv::block_relative, T> eng(model, 4096);
      const auto builder = [&] {
        relokv::layout_builder b(16, model->cfg.vocab);
        if (model->links) b.links(model->links->layout_rows(model->cfg.vocab));
        return b;
      };
      for (const auto& d : docs) {  // each passage compiled behind the system prompt
        (void)eng.prefill(builder().prefix(prefix).span(d).build(), relokv::recompute::none{});
        eng.end(true);
      }
      auto b = builder();
      b.prefix(prefix);
      std::vector<relokv::token_t> all = prefix;
      for (const auto& d : docs) {
        b.span(d);
        all.insert(all.end(), d.begin(), d.end());
      }
      all.insert(all.end(), question.begin(), question.end());
      relokv_engine::prefill_stats st;
      nlohmann::json out;
      out["links"] = eng.prefill(b.question(question).build(), relokv::recompute::none{}, &st);
      out["relocated_blocks"] = st.relocated_hits;
      eng.end(false);
      out["full"] =
          eng.prefill(relokv::layout_builder(16).prefix(all).build(), relokv::recompute::full{});
      eng.end(false);
      return out;
    };
    const auto out =
        kv == "fp32" ? run(static_cast<float*>(nullptr)) : run(static_cast<relokv::bf16*>(nullptr));
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relokv_links_probe: %s\n", e.what());
    return 1;
  }
}
