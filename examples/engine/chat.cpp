// relokv_chat: greedy answer from a GGUF Llama model running on relokv.
//   relokv_chat [--model PATH] [--placement pre_rotated|at_attention|block_relative]
//               [--max-tokens N] "question"
// Without a model (see scripts/get-model) it runs the synthetic model and prints token ids.
#include <relokv/layout/builder.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "generate_escalating.hpp"
#include "load_model.hpp"
#include "model_path.hpp"
#include "strategy_profile.hpp"
#include "tokenizer.hpp"

namespace {

void usage() {
  std::printf(
      "usage: relokv_chat [--model PATH] [--placement P] [--max-tokens N] \"question\"\n"
      "  --model PATH      GGUF Llama model (default: $RELOKV_MODEL or the scripts/get-model "
      "cache;\n"
      "                    without one, a small synthetic model)\n"
      "  --placement P     pre_rotated, at_attention or block_relative (default)\n"
      "  --max-tokens N    most tokens to generate (default 64)\n"
      "  --kv-dtype T      the KV pool's element type: bf16 (default) or fp32\n"
      "  --fp32-activations  multiply every weight type in fp32 (dequantized panels) instead of\n"
      "                    the integer kernels (int16 tiles in prefill, int8 in decode)\n"
      "  --profile FILE    strategy profile from relokv_rag --calibrate: checked against the\n"
      "                    model and used for the request's reuse plan\n");
}

template <class P, class T>
int run(std::shared_ptr<const relokv_engine::llama_model> m, const relokv_engine::tokenizer* tok,
        const std::string& question, int max_tokens,
        const relokv::recompute::any_strategy& strategy,
        const relokv::recompute::escalation_policy& escalation) {
  relokv_engine::llama_engine<P, T> eng(m, 1024);
  std::vector<relokv::token_t> prompt;
  relokv::token_t stop = -1;
  if (tok) {
    prompt = tok->encode(tok->chat(m->cfg.arch == "qwen2" ? "You are a helpful assistant."
                                   : m->cfg.arch == "llama"
                                       ? "You are a helpful AI assistant named SmolLM, trained by "
                                         "Hugging Face"
                                       : "",
                                   question));
    stop = tok->end_of_turn();
  } else {
    for (unsigned char c : question) prompt.push_back(c % m->cfg.vocab);
  }
  const auto layout = relokv::layout_builder(16).prefix(prompt).build();
  // The profile's escalation policy, if it has one: full recompute where the answer is unsure.
  const auto ans = relokv_engine::generate_escalating(eng, layout, layout, strategy, escalation,
                                                      max_tokens, stop);
  eng.end();
  const auto& out = ans.tokens;
  if (ans.escalated_at >= 0)
    std::fprintf(stderr, "relokv_chat: escalated to full recompute at answer token %d (%s)\n",
                 ans.escalated_at, escalation.label().c_str());
  if (tok) {
    std::string text = tok->decode(out);
    for (const std::string& end : tok->stop_texts())
      if (const auto p = text.find(end); p != std::string::npos) text.resize(p);
    std::printf("%s\n", text.c_str());
  } else {
    for (auto t : out) std::printf("%d ", t);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = relokv_engine::default_model_path(), placement = "block_relative", question;
  std::string profile, kv_dtype = "bf16";
  int max_tokens = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (a == "--placement" && i + 1 < argc) {
      placement = argv[++i];
    } else if (a == "--fp32-activations") {
      relokv_engine::use_integer_kernels(false);
    } else if (a == "--kv-dtype" && i + 1 < argc) {
      kv_dtype = argv[++i];
    } else if (a == "--profile" && i + 1 < argc) {
      profile = argv[++i];
    } else if (a == "--max-tokens" && i + 1 < argc) {
      max_tokens = std::atoi(argv[++i]);
    } else if (a == "--help" || a == "-h") {
      usage();
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "relokv_chat: unknown option '%s'\n", a.c_str());
      usage();
      return 2;
    } else {
      question = a;
    }
  }
  if (question.empty()) question = "What is the capital of France?";
  try {
    if (model.empty())
      std::fprintf(stderr,
                   "relokv_chat: no model found (run scripts/get-model); using the "
                   "synthetic model, which answers in token ids\n");
    const auto loaded = relokv_engine::load_model(model);
    const auto& m = loaded.model;
    const auto* tok = loaded.tokenizer.get();
    relokv::recompute::any_strategy strategy = relokv::recompute::none{};
    relokv::recompute::escalation_policy escalation;
    if (!profile.empty()) {
      const auto p = relokv_engine::load_profile(profile);
      if (p.safe) escalation = p.escalation;
      strategy = relokv_engine::profile_strategy(p, *m);  // throws for another model's profile
      std::fprintf(stderr, "relokv_chat: profile %s: %s\n", profile.c_str(),
                   p.safe ? (p.strategy.label() + (p.escalation.enabled
                                                       ? ", escalating at " + p.escalation.label()
                                                       : std::string()))
                                .c_str()
                          : "unsafe: full recompute");
    }
    if (kv_dtype != "bf16" && kv_dtype != "fp32") {
      std::fprintf(stderr, "relokv_chat: unknown KV dtype '%s' (bf16 or fp32)\n", kv_dtype.c_str());
      return 2;
    }
    const bool f32 = kv_dtype == "fp32";
    const auto go = [&](auto placement_tag) {
      using P = decltype(placement_tag);
      return f32 ? run<P, float>(m, tok, question, max_tokens, strategy, escalation)
                 : run<P, relokv::bf16>(m, tok, question, max_tokens, strategy, escalation);
    };
    if (placement == "pre_rotated") return go(relokv::pre_rotated{});
    if (placement == "at_attention") return go(relokv::at_attention{});
    if (placement == "block_relative") return go(relokv::block_relative{});
    std::fprintf(stderr, "relokv_chat: unknown placement '%s'\n", placement.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relokv_chat: %s\n", e.what());
    return 1;
  }
}
