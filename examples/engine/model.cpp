// Model loading of the example engine (model.hpp): GGUF and synthetic weights, checks.
#include "isa.hpp"
#include "llama_engine.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

#include <xxhash.h>
#include <relokv/attention/detail/amx_bf16.hpp>

namespace relokv_engine {
namespace {

std::vector<float> tensor_as(const gguf_file& f, const std::string& name,
                             std::vector<std::uint64_t> dims) {
  const gguf_tensor& t = f.tensor(name);
  if (t.dims != dims) {
    std::string want, got;
    for (auto d : dims) want += std::to_string(d) + " ";
    for (auto d : t.dims) got += std::to_string(d) + " ";
    throw gguf_error(f.name(), t.offset,
                     "tensor '" + name + "' has shape [ " + got + "], expected [ " + want + "]");
  }
  return f.dequantize(t);
}
}  // namespace

void check_tokens(const llama_model& m, std::span<const relokv::token_t> tokens,
                  const char* where) {
  const std::int64_t ids = m.input_ids();
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= ids)
      throw std::out_of_range(std::string(where) + ": token " + std::to_string(i) + " = " +
                              std::to_string(tokens[i]) + " outside the vocabulary [0, " +
                              std::to_string(m.cfg.vocab) + ")" +
                              (m.links ? " and the adapter's rows [" + std::to_string(m.cfg.vocab) +
                                             ", " + std::to_string(ids) + ")"
                                       : std::string()));
}

void llama_model::embed(relokv::token_t token, float* out) const {
  const auto D = static_cast<std::size_t>(cfg.dim);
  if (token >= cfg.vocab) {  // an adapter's row, as the trainer gives it
    const float* r = links->rows.data() + static_cast<std::size_t>(token - cfg.vocab) * D;
    std::copy(r, r + D, out);
    return;
  }
  tok_emb.dequantize_row(token, out);
  if (cfg.embed_scale != 1.0f)
    for (std::size_t d = 0; d < D; ++d) out[d] *= cfg.embed_scale;
}

namespace {
/// RELOKV_ISA, checked before a model exists; under a cap below amx the attention's AMX tiles
/// are switched off too (the engine's own kernels ask isa_cap() themselves).
void apply_isa_cap() {
  check_isa_env();
  if (isa_cap() < isa_level::kAmx) relokv::detail::amx::switched_on().store(false);
}
}  // namespace

llama_model llama_model::from_gguf(const gguf_file& f) {
  apply_isa_cap();
  const std::string arch = f.get_string("general.architecture");
  if (arch != "llama" && arch != "qwen2" && arch != "gemma3")
    throw gguf_error(f.name(), 0,
                     "architecture '" + arch + "' is not supported (llama, qwen2 and gemma3 are)");
  const bool qwen2 = arch == "qwen2", gemma = arch == "gemma3";
  const std::string a = arch + ".";  // hyperparameter keys are prefixed by the architecture
  llama_model m;
  llama_config& c = m.cfg;
  c.arch = arch;
  c.name = f.has("general.name") ? f.get_string("general.name") : arch;
  // Every hyperparameter is checked where it is read, with the key and the value it had.
  auto bad = [&](const std::string& key, const std::string& value, const std::string& want) {
    throw gguf_error(f.name(), 0, key + " = " + value + ": " + want);
  };
  auto int_key = [&](const std::string& key, std::int64_t lo, std::int64_t hi,
                     std::optional<std::int64_t> fallback = std::nullopt) {
    const std::int64_t v = fallback ? f.get_int(key, *fallback) : f.get_int(key);
    if (v < lo || v > hi)
      bad(key, std::to_string(v),
          "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return static_cast<std::int32_t>(v);
  };
  auto float_key = [&](const std::string& key, double fallback, double above) {
    const double v = f.get_float(key, fallback);
    if (!std::isfinite(v) || !(v > above))
      bad(key, std::to_string(v), "must be finite and > " + std::to_string(above));
    return v;
  };
  constexpr std::int64_t kMaxDim = 1 << 16;
  c.n_layers = int_key(a + "block_count", 1, 4096);
  c.dim = int_key(a + "embedding_length", 1, kMaxDim);
  c.n_heads = int_key(a + "attention.head_count", 1, 4096);
  c.n_kv_heads = int_key(a + "attention.head_count_kv", 1, c.n_heads, c.n_heads);
  c.ffn = int_key(a + "feed_forward_length", 1, 1 << 20);
  // A head's width: attention.key_length where the file gives it (Gemma 3: 256 for a dim of
  // 640 and 4 heads), else dim / head_count.
  const bool key_length = f.has(a + "attention.key_length");
  if ((!key_length && c.dim % c.n_heads != 0) || c.n_heads % c.n_kv_heads)
    throw gguf_error(f.name(), 0,
                     "inconsistent attention head counts: embedding_length " +
                         std::to_string(c.dim) + ", head_count " + std::to_string(c.n_heads) +
                         ", head_count_kv " + std::to_string(c.n_kv_heads));
  c.head_dim =
      key_length ? int_key(a + "attention.key_length", 2, relokv::kMaxHeadDim) : c.dim / c.n_heads;
  if (key_length &&
      int_key(a + "attention.value_length", 1, relokv::kMaxHeadDim, c.head_dim) != c.head_dim)
    bad(a + "attention.value_length", std::to_string(f.get_int(a + "attention.value_length")),
        "must equal attention.key_length (" + std::to_string(c.head_dim) + ")");
  if (c.head_dim > relokv::kMaxHeadDim)
    bad(a + "embedding_length / llama.attention.head_count", std::to_string(c.head_dim),
        "head dimension above relokv::kMaxHeadDim");
  c.rms_eps = static_cast<float>(float_key(a + "attention.layer_norm_rms_epsilon", 1e-5, 0.0));
  const auto& emb = f.tensor("token_embd.weight");
  if (emb.dims.size() != 2 || emb.dims[1] == 0 || emb.dims[1] > (1u << 24))
    throw gguf_error(f.name(), emb.offset,
                     "token_embd.weight must be [dim, vocab], vocab in [1, 2^24]");
  c.vocab = static_cast<std::int32_t>(emb.dims[1]);
  c.rope.head_dim = c.head_dim;
  c.rope.rotary_dim = int_key(a + "rope.dimension_count", 2, c.head_dim, c.head_dim);
  if (c.rope.rotary_dim % 2 != 0)
    bad(a + "rope.dimension_count", std::to_string(c.rope.rotary_dim), "must be even");
  c.rope.theta = float_key(a + "rope.freq_base", 10000.0, 1.0);
  // GGUF llama checkpoints permute Q and K at conversion so that pairs are adjacent; qwen2
  // keeps the checkpoint's layout, whose pairs are half a rotary dimension apart.
  c.rope.layout = qwen2 || gemma ? relokv::rope_layout::kNeoX : relokv::rope_layout::kGPTJ;
  if (f.has(a + "rope.scaling.type")) {
    const std::string t = f.get_string(a + "rope.scaling.type");
    if (t == "linear" || t == "yarn")
      c.rope.factor = float_key(a + "rope.scaling.factor", 1.0, 0.0);
    if (t == "linear") {
      c.rope.scaling = relokv::rope_scaling::kLinear;
    } else if (t == "yarn") {
      c.rope.scaling = relokv::rope_scaling::kYaRN;
      c.rope.original_max_position =
          int_key(a + "rope.scaling.original_context_length", 1, 1 << 24, 4096);
    } else if (t != "none") {
      bad(a + "rope.scaling.type", "'" + t + "'", "is not none, linear or yarn");
    }
  }
  if (gemma) {
    // Gemma 3: windowed layers (attention.sliding_window tokens; five in six by default, as
    // llama.cpp reads attention.sliding_window_pattern) on their own RoPE base
    // (rope.freq_base_swa, 10,000 by default) without the global layers' scaling.
    c.sliding_window = int_key(a + "attention.sliding_window", 0, 1 << 24, 0);
    c.swa_pattern = int_key(a + "attention.sliding_window_pattern", 1, 4096, 6);
    c.rope_local = c.rope;
    c.rope_local.scaling = relokv::rope_scaling::kNone;
    c.rope_local.factor = 1.0;
    c.rope_local.theta = float_key(a + "rope.freq_base_swa", 10000.0, 1.0);
    c.embed_scale = std::sqrt(static_cast<float>(c.dim));
    c.logit_softcap = static_cast<float>(f.get_float(a + "final_logit_softcapping", 0.0));
    if (!std::isfinite(c.logit_softcap) || c.logit_softcap < 0.0f)
      bad(a + "final_logit_softcapping", std::to_string(c.logit_softcap), "must be >= 0");
  }
  try {
    c.rope.validate();
    if (gemma) c.rope_local.validate();
  } catch (const relokv::error& e) {
    throw gguf_error(f.name(), 0, e.what());
  }
  const auto D = static_cast<std::uint64_t>(c.dim), F = static_cast<std::uint64_t>(c.ffn);
  const auto Q = static_cast<std::uint64_t>(c.n_heads * c.head_dim);
  const auto K = static_cast<std::uint64_t>(c.n_kv_heads * c.head_dim);
  const auto V = static_cast<std::uint64_t>(c.vocab);
  // Matrices stay in the file's mapping and types; norms and biases are read as fp32.
  const auto mat = [&](const std::string& name, std::vector<std::uint64_t> dims) {
    const gguf_tensor& t = f.tensor(name);
    if (t.dims != dims) (void)tensor_as(f, name, dims);  // throws, naming both shapes
    return qmatrix::view(f, t, f.keep_alive());
  };
  m.tok_emb = mat("token_embd.weight", {D, V});
  if (f.has_tensor("output.weight")) m.output = mat("output.weight", {D, V});
  m.out_norm = tensor_as(f, "output_norm.weight", {D});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    llama_layer L;
    L.attn_norm = tensor_as(f, p + "attn_norm.weight", {D});
    L.wq = mat(p + "attn_q.weight", {D, Q});
    L.wk = mat(p + "attn_k.weight", {D, K});
    L.wv = mat(p + "attn_v.weight", {D, K});
    if (qwen2) {
      L.bq = tensor_as(f, p + "attn_q.bias", {Q});
      L.bk = tensor_as(f, p + "attn_k.bias", {K});
      L.bv = tensor_as(f, p + "attn_v.bias", {K});
    }
    L.wo = mat(p + "attn_output.weight", {Q, D});
    if (gemma) {
      const auto hd = static_cast<std::uint64_t>(c.head_dim);
      L.q_norm = tensor_as(f, p + "attn_q_norm.weight", {hd});
      L.k_norm = tensor_as(f, p + "attn_k_norm.weight", {hd});
      L.post_attn_norm = tensor_as(f, p + "post_attention_norm.weight", {D});
      L.post_ffn_norm = tensor_as(f, p + "post_ffw_norm.weight", {D});
    }
    L.ffn_norm = tensor_as(f, p + "ffn_norm.weight", {D});
    L.w_gate = mat(p + "ffn_gate.weight", {D, F});
    L.w_up = mat(p + "ffn_up.weight", {D, F});
    L.w_down = mat(p + "ffn_down.weight", {F, D});
    m.layers.push_back(std::move(L));
  }
  // The weights' identity for the store fingerprint: every tensor's name, type and bytes.
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  for (const gguf_tensor& t : f.tensors()) {
    XXH3_64bits_update(h, t.name.data(), t.name.size());
    const auto type = static_cast<std::uint32_t>(t.type);
    XXH3_64bits_update(h, &type, sizeof type);
    XXH3_64bits_update(h, t.data, t.bytes);
  }
  c.weights_id = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return m;
}

llama_model llama_model::synthetic(const llama_config& cfg_in, std::uint32_t seed) {
  apply_isa_cap();
  llama_model m;
  m.cfg = cfg_in;
  llama_config& c = m.cfg;
  c.rope.head_dim = c.head_dim;
  c.rope.rotary_dim = c.head_dim;
  // arch "qwen2": NeoX pairs and Q/K/V biases, as from_gguf reads a qwen2 file.
  const bool qwen2 = c.arch == "qwen2";
  // arch "gemma3": NeoX pairs, QK and post norms, GELU, scaled embeddings, and windowed layers
  // (the caller's sliding_window; pattern 6 unless given) on a base of 10,000 beside the
  // global layers' 1,000,000.
  const bool gemma = c.gemma();
  c.rope.layout = qwen2 || gemma ? relokv::rope_layout::kNeoX : relokv::rope_layout::kGPTJ;
  if (gemma) {
    c.rope.theta = 1000000.0;
    if (c.swa_pattern == 0) c.swa_pattern = 6;
    c.rope_local = c.rope;
    c.rope_local.theta = 10000.0;
    c.embed_scale = std::sqrt(static_cast<float>(c.dim));
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  auto vec = [&](int out, int in, float gain = 1.0f) {
    std::vector<float> w(static_cast<std::size_t>(out) * in);
    const float s = 1.0f / std::sqrt(static_cast<float>(in));
    for (auto& x : w) x = nd(rng) * s;
    if (gain != 1.0f)
      for (auto& x : w) x *= gain;
    return w;
  };
  auto mat = [&](int out, int in, float gain = 1.0f) {
    return qmatrix::owned(vec(out, in, gain), out, in);
  };
  auto ones = [](int n) { return std::vector<float>(static_cast<std::size_t>(n), 1.0f); };
  m.tok_emb = mat(c.vocab, c.dim);  // rows of norm ~1: the attention output is not drowned
  m.out_norm = ones(c.dim);
  for (int l = 0; l < c.n_layers; ++l) {
    llama_layer L;
    L.attn_norm = ones(c.dim);
    // Sharper attention than random init gives, so that context (and reusing KV computed in
    // another context) visibly changes the output.
    L.wq = mat(c.n_heads * c.head_dim, c.dim, 3.0f);
    L.wk = mat(c.n_kv_heads * c.head_dim, c.dim, 3.0f);
    L.wv = mat(c.n_kv_heads * c.head_dim, c.dim);
    if (qwen2) {
      L.bq = vec(1, c.n_heads * c.head_dim);
      L.bk = vec(1, c.n_kv_heads * c.head_dim);
      L.bv = vec(1, c.n_kv_heads * c.head_dim);
    }
    L.wo = mat(c.dim, c.n_heads * c.head_dim);
    if (gemma) {
      L.q_norm = L.k_norm = ones(c.head_dim);
      L.post_attn_norm = L.post_ffn_norm = ones(c.dim);
    }
    L.ffn_norm = ones(c.dim);
    L.w_gate = mat(c.ffn, c.dim);
    L.w_up = mat(c.ffn, c.dim);
    L.w_down = mat(c.dim, c.ffn);
    m.layers.push_back(std::move(L));
  }
  const std::uint64_t shape[] = {seed,
                                 std::uint64_t(c.n_layers),
                                 std::uint64_t(c.dim),
                                 std::uint64_t(c.n_heads),
                                 std::uint64_t(c.n_kv_heads),
                                 std::uint64_t(c.head_dim),
                                 std::uint64_t(c.ffn),
                                 std::uint64_t(c.vocab),
                                 std::uint64_t(qwen2)};
  c.weights_id = XXH3_64bits(shape, sizeof shape);
  if (gemma) {
    const std::uint64_t g[] = {1, std::uint64_t(c.sliding_window), std::uint64_t(c.swa_pattern)};
    c.weights_id = XXH3_64bits_withSeed(g, sizeof g, c.weights_id);
  }
  return m;
}

std::size_t llama_model::weight_bytes() const {
  std::size_t n = tok_emb.bytes() + output.bytes();
  for (const llama_layer& L : layers)
    for (const qmatrix* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      n += w->bytes();
  return n;
}

relokv::token_t argmax(const std::vector<float>& logits) {
  return static_cast<relokv::token_t>(std::max_element(logits.begin(), logits.end()) -
                                      logits.begin());
}

}  // namespace relokv_engine
