// Reference-engine throughput on SmolLM2 (the synthetic model without it), side by side
// across builds: prefill of a 1,024-token prompt three times, then 16 greedy decode steps
// after it (or argv[1] steps; argv[2] names another model, e.g. qwen2.5-0.5b).
// ./build/bench/relokv_engine_throughput here; against another checkout, compile this file with its
// examples/engine and include directories and its librelokv_engine.a
// (-lopenblas -lpthread -lhiredis), and alternate the two (bench/results/engine-2026-12-01.md).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <relokv/layout/builder.hpp>
#include <string>
#include "llama_engine.hpp"
#include "load_model.hpp"
#include "model_path.hpp"
#include "qgemm.hpp"
int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 16;
  // RELOKV_TILES=int16: prefill on the int16 tiles where the host has AMX (side by side).
  if (const char* t = std::getenv("RELOKV_TILES"); t != nullptr && std::string(t) == "int16")
    relokv_engine::use_amx_tiles(false);
  auto lm =
      relokv_engine::load_model(relokv_engine::default_model_path(argc > 2 ? argv[2] : "smollm2"));
  std::vector<relokv::token_t> ids;
  for (int i = 0; i < 1024; ++i) ids.push_back((i * 7919) % 4096);
  relokv_engine::llama_engine<relokv::block_relative> e(lm.model, 128);
  auto l = relokv::layout_builder(16).prefix(ids).build();
  for (int r = 0; r < 3; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    auto x = e.prefill(l, relokv::recompute::none{});
    auto t1 = std::chrono::steady_clock::now();
    double s = std::chrono::duration<double>(t1 - t0).count();
    std::printf("prefill 1024: %.3f s = %.0f tok/s\n", s, 1024 / s);
    if (r == 2) {
      auto t = relokv_engine::argmax(x);
      auto d0 = std::chrono::steady_clock::now();
      for (int k = 0; k < steps; ++k) t = relokv_engine::argmax(e.decode(t));
      auto d1 = std::chrono::steady_clock::now();
      std::printf("decode: %.0f tok/s\n", steps / std::chrono::duration<double>(d1 - d0).count());
    }
    e.end(false);
  }
}
