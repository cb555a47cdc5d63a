#pragma once
// The example engine's model: a Llama-family transformer as its GGUF file has it (the weights in
// their own types, qgemm.hpp), with the span-link adapter it serves (links.hpp). Loaded by
// load_model.hpp; computed by llama_engine.hpp.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <relokv/rope/rotate.hpp>
#include <relokv/types.hpp>

#include "gguf.hpp"
#include "links.hpp"
#include "qgemm.hpp"

namespace relokv_engine {

struct llama_config {
  std::int32_t n_layers = 2;
  std::int32_t dim = 64;
  std::int32_t n_heads = 4;
  std::int32_t n_kv_heads = 2;
  std::int32_t head_dim = 16;
  std::int32_t ffn = 128;
  std::int32_t vocab = 256;
  float rms_eps = 1e-5f;
  std::string arch = "llama";      ///< general.architecture
  std::string name = "synthetic";  ///< general.name
  /// Identity of the weights (XXH3-64 of the tensor data, or of the synthetic seed and shape):
  /// with the RoPE configuration and placement it is the store fingerprint of this model's KV.
  std::uint64_t weights_id = 0;
  relokv::rope_config rope;  ///< the global layers' RoPE (every layer's but Gemma 3's local ones)
  // Gemma 3 (arch "gemma3"): sliding-window layers with their own RoPE base, QK norms, norms
  // after attention and MLP, GELU-tanh, scaled embeddings. Zero/empty for llama and qwen2.
  std::int32_t sliding_window = 0;  ///< tokens a windowed layer sees (0: no windowed layer)
  std::int32_t swa_pattern = 0;     ///< layer l is windowed when l % swa_pattern < swa_pattern - 1
  relokv::rope_config rope_local;   ///< the windowed layers' RoPE
  float embed_scale = 1.0f;         ///< embeddings are multiplied by it (Gemma: sqrt(dim))
  float logit_softcap = 0.0f;       ///< final logits c tanh(x / c) when > 0 (Gemma 2)
  [[nodiscard]] bool gemma() const noexcept { return arch == "gemma3"; }
  /// Whether layer l attends through a sliding window.
  [[nodiscard]] bool windowed(std::int32_t l) const noexcept {
    return sliding_window > 0 && swa_pattern > 0 && l % swa_pattern < swa_pattern - 1;
  }
  /// Every layer's RoPE and window, for relokv::layer_rope.
  [[nodiscard]] std::vector<relokv::layer_rope::layer> geometry() const {
    std::vector<relokv::layer_rope::layer> g;
    for (std::int32_t l = 0; l < n_layers; ++l)
      g.push_back(windowed(l) ? relokv::layer_rope::layer{rope_local, sliding_window}
                              : relokv::layer_rope::layer{rope, 0});
    return g;
  }
};

struct llama_layer {
  std::vector<float> attn_norm, ffn_norm;
  qmatrix wq, wk, wv, wo, w_gate, w_up, w_down;  ///< [out][in], in the file's types
  std::vector<float> bq, bk, bv;                 ///< Q/K/V biases (qwen2); empty for llama
  /// Gemma 3: RMS norms of each head's query and key ([head_dim]), and of the attention and
  /// MLP outputs before the residual adds ([dim]); empty otherwise.
  std::vector<float> q_norm, k_norm, post_attn_norm, post_ffn_norm;
};

/// The weights as the file has them: each matrix a qmatrix [out][in] in its GGUF type,
/// pointing into the file's mapping (which it keeps alive); norms and biases in fp32.
struct llama_model {
  llama_config cfg;
  qmatrix tok_emb;  // [vocab][dim]
  qmatrix output;   // [vocab][dim]; empty when tied to tok_emb
  std::vector<float> out_norm;
  std::vector<llama_layer> layers;
  /// A span-link adapter's rows, read for ids vocab .. vocab + links->n - 1 (with_links);
  /// null: token ids only.
  std::shared_ptr<const link_adapter> links;

  /// The first layer's input for `token`: its embedding row times the embedding scale, or an
  /// adapter's row as it is. The id must have passed check_tokens.
  void embed(relokv::token_t token, float* out) const;
  /// Ids check_tokens admits: the vocabulary and the adapter's rows.
  [[nodiscard]] std::int64_t input_ids() const noexcept {
    return std::int64_t{cfg.vocab} + (links ? links->n : 0);
  }

  /// Reads a GGUF model of architecture "llama" (GPT-J pair layout: the converter permutes Q
  /// and K), "qwen2" (Q/K/V biases, NeoX half-split RoPE on unpermuted weights, untied
  /// output) or "gemma3" (see llama_config); throws gguf_error naming what is wrong.
  static llama_model from_gguf(const gguf_file& f);
  /// A small model with deterministic pseudo-random weights, so that everything runs offline.
  static llama_model synthetic(const llama_config& cfg = {}, std::uint32_t seed = 1);
  [[nodiscard]] const qmatrix& lm_head() const { return output.empty() ? tok_emb : output; }
  /// Bytes of the weight matrices as held in memory (their GGUF types).
  [[nodiscard]] std::size_t weight_bytes() const;
};

/// @throws std::out_of_range naming `where`, the index and the id of the first token outside
///         [0, vocab). The engine's entry points (prefill, decode, plain_prefill) call it.
void check_tokens(const llama_model& m, std::span<const relokv::token_t> tokens, const char* where);

}  // namespace relokv_engine
