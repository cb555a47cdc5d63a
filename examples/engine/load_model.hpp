#pragma once
// One way in for the examples: a GGUF model with its tokenizer, or the synthetic model.
#include <memory>
#include <string>

#include "gguf.hpp"
#include "llama_engine.hpp"
#include "tokenizer.hpp"

namespace relokv_engine {

/// The synthetic model the demo and the figures use when no model is present: Llama-shaped,
/// head_dim 64 (the host attention's fast path), small enough for 2 cores.
inline llama_config demo_config() {
  llama_config c;
  c.n_layers = 4;
  c.dim = 512;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.ffn = 1024;
  c.vocab = 4096;
  return c;
}

struct loaded_model {
  std::shared_ptr<const llama_model> model;
  std::unique_ptr<relokv_engine::tokenizer> tokenizer;  ///< null for the synthetic model
};

/// Reads a GGUF model and its tokenizer; an empty path gives the synthetic model.
/// @throws gguf_error for a missing, corrupt or unsupported file
inline loaded_model load_model(const std::string& path) {
  loaded_model out;
  if (path.empty()) {
    out.model = std::make_shared<const llama_model>(llama_model::synthetic(demo_config()));
    return out;
  }
  const gguf_file f = gguf_file::open(path);
  out.model = std::make_shared<const llama_model>(llama_model::from_gguf(f));
  out.tokenizer = std::make_unique<relokv_engine::tokenizer>(f);
  return out;
}

}  // namespace relokv_engine
