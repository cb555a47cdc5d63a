// The C++ side of the Python package's tests (tests/python): runs a sequence of requests,
// described in a JSON file, on relocatable_cache or on the example engine, and prints what
// each did (plans, logits as their bit patterns) for the same sequence made from Python.
//   relokv_py_oracle SPEC.json
// SPEC: {"cache": {num_blocks, block_size, placement}} or {"engine": {model, num_blocks,
// block_size, placement, kv_dtype}}, and "requests": [{prefix, spans, question, strategy}].
#include <bit>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <relokv/relokv.hpp>

#include "llama_engine.hpp"
#include "load_model.hpp"
#include "strategy_profile.hpp"

namespace {

using json = nlohmann::json;

const relokv_engine::named_strategy& named(const std::string& key) {
  static const auto table = relokv_engine::strategy_table();
  for (const auto& n : table)
    if (n.key == key) return n;
  throw std::invalid_argument("unknown strategy " + key);
}
relokv::recompute::any_strategy strategy_of(const std::string& key) {
  return named(key).spec.make();
}

relokv::request_layout layout_of(const json& r, std::int32_t block_size) {
  relokv::layout_builder b(block_size);
  b.prefix(r.at("prefix").get<std::vector<relokv::token_t>>());
  for (const auto& s : r.at("spans")) b.span(s.get<std::vector<relokv::token_t>>());
  b.question(r.at("question").get<std::vector<relokv::token_t>>());
  return b.build();
}

json plan_json(const relokv::reuse_plan& p) {
  static const char* status[] = {"miss", "exact", "relocated"};
  static const char* tier[] = {"computed", "pool", "store"};
  json blocks = json::array();
  for (const auto& b : p.blocks)
    blocks.push_back({{"physical", b.physical},
                      {"source", b.source},
                      {"pos0", b.pos0},
                      {"len", b.len},
                      {"status", status[static_cast<int>(b.status)]},
                      {"tier", tier[static_cast<int>(b.tier)]},
                      {"fresh", b.fresh},
                      {"copy_on_write", b.copy_on_write}});
  return {{"ok", p.ok()},
          {"id", p.id},
          {"exact_hits", p.exact_hits},
          {"relocated_hits", p.relocated_hits},
          {"misses", p.misses},
          {"tokens_to_compute", p.tokens_to_compute},
          {"compute", p.compute},
          {"blocks", blocks}};
}

template <class P>
json run_cache(const json& spec) {
  const json& c = spec.at("cache");
  const std::int32_t bs = c.at("block_size");
  relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool, P,
                            relokv::recompute::any_strategy>
      cache(relokv::lru_block_pool(c.at("num_blocks").get<std::int32_t>()), bs, relokv::xxh3_128(0),
            strategy_of("naive"));
  json plans = json::array();
  for (const auto& r : spec.at("requests")) {
    const auto p = cache.plan(layout_of(r, bs), strategy_of(r.at("strategy")));
    plans.push_back(plan_json(p));
    if (p.ok()) {
      cache.commit(p.id);
      cache.release(p.id);
    }
  }
  return {{"plans", plans}};
}

template <class P, class T>
json run_engine(const json& spec) {
  const json& e = spec.at("engine");
  const auto loaded = relokv_engine::load_model(e.at("model").get<std::string>());
  const std::int32_t bs = e.at("block_size");
  relokv_engine::llama_engine<P, T> eng(loaded.model, e.at("num_blocks"), bs);
  json logits = json::array(), stats = json::array();
  for (const auto& r : spec.at("requests")) {
    relokv_engine::prefill_stats st;
    // A strategy without spans (full, prefix) reads the prompt as one prefix, as relokv_rag's
    // variants and relokv.Engine.prefill do.
    auto layout = layout_of(r, bs);
    if (!named(r.at("strategy")).spans)
      layout = relokv::layout_builder(bs).prefix(layout.tokens).build();
    const auto l = eng.prefill(layout, strategy_of(r.at("strategy")), &st);
    std::vector<std::uint32_t> bits;
    for (float x : l) bits.push_back(std::bit_cast<std::uint32_t>(x));
    logits.push_back(bits);
    stats.push_back({{"computed", st.computed},
                     {"token_layers", st.token_layers},
                     {"exact_hits", st.exact_hits},
                     {"relocated_hits", st.relocated_hits},
                     {"misses", st.misses}});
    eng.end(true);
  }
  return {{"logits", logits}, {"stats", stats}};
}

template <class T>
json engine_with(const json& spec) {
  const std::string p = spec.at("engine").at("placement");
  if (p == "at_attention") return run_engine<relokv::at_attention, T>(spec);
  if (p == "pre_rotated") return run_engine<relokv::pre_rotated, T>(spec);
  return run_engine<relokv::block_relative, T>(spec);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: relokv_py_oracle SPEC.json\n");
    return 2;
  }
  try {
    std::ifstream in(argv[1]);
    const json spec = json::parse(in);
    json out;
    if (spec.contains("cache")) {
      const std::string p = spec.at("cache").at("placement");
      out = p == "pre_rotated"      ? run_cache<relokv::pre_rotated>(spec)
            : p == "block_relative" ? run_cache<relokv::block_relative>(spec)
                                    : run_cache<relokv::at_attention>(spec);
    } else {
      out = spec.at("engine").at("kv_dtype") == "fp32" ? engine_with<float>(spec)
                                                       : engine_with<relokv::bf16>(spec);
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relokv_py_oracle: %s\n", e.what());
    return 1;
  }
}
