#pragma once
// A small Llama-family forward pass on relokv: paged KV through relokv's host attention, reuse
// plans from relocatable_cache honoured (only the masked tokens are computed; dynamic strategies
// refined layer by layer), fp32 activations, weights in their GGUF types (qgemm.hpp).
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/concepts/rope_placement.hpp>
#include <relokv/dtype.hpp>
#include <relokv/layout/request_layout.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/recompute/any_strategy.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/layer_rope.hpp>
#include <relokv/rope/pre_rotated.hpp>
#include <relokv/rope/rotate.hpp>
#include <relokv/store/any_store.hpp>

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

/// What one prefill did.
struct prefill_stats {
  std::int32_t tokens = 0;
  std::int32_t computed = 0;      ///< tokens computed at the first layer
  std::int64_t token_layers = 0;  ///< tokens computed, summed over the layers (the work done)
  /// Dynamic strategies, per logical position: the deviation measured at the first check
  /// layer (0 where not measured), and the tokens still computed after that check.
  std::vector<float> check_deviation;
  std::vector<std::uint8_t> check_kept;
  std::int32_t exact_hits = 0, relocated_hits = 0, misses = 0;
  std::int32_t store_hits = 0;  ///< hits fetched from the store (within exact + relocated)
  /// Blocks by where their K and V came from (reuse_plan's tiers): the pool, the store, or
  /// computed by this request (misses, and hits recomputed whole).
  std::int32_t pool_blocks = 0, store_blocks = 0, computed_blocks = 0;
};

/// The pool cannot hold what a request asks for now: a scheduler waits for blocks to come
/// back (or preempts a sequence) and asks again; nothing of the request was kept.
struct out_of_blocks : std::runtime_error {
  out_of_blocks(const std::string& what, std::int32_t more)
      : std::runtime_error(what), blocks_short(more) {}
  std::int32_t blocks_short;  ///< blocks missing (0: unknown)
};

/// One engine instance: a model, a paged KV pool and a relocatable_cache over it.
///
/// Many requests may be live at once (a server's batch), each a sequence: open() plans one
/// and loads its reused blocks, prefill_step() computes its prompt in chunks, append() and
/// decode_step() advance any set of sequences by one token in one forward, close() commits or
/// releases it. prefill(), decode() and end() are the one-request loop over the same calls.
/// One thread drives an engine (it owns the cache); the forward passes use the two lanes.
/// @tparam P RoPE placement of the stored keys
/// @tparam T the KV pool's element type: bf16 (the default: the host attention's fast path,
///           half the bytes) or float
template <class P, class T = relokv::bf16>
class llama_engine {
 public:
  using cache_type = relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool, P,
                                               relokv::recompute::any_strategy, relokv::any_store>;

  /// @param store  where spans outlive the process (empty: the pool only). Pool misses are
  ///               looked up there, and the blocks a request computes are written at end().
  llama_engine(std::shared_ptr<const llama_model> model, std::int32_t num_blocks,
               std::int32_t block_size = 16, relokv::any_store store = {});
  ~llama_engine();
  llama_engine(const llama_engine&) = delete;
  llama_engine& operator=(const llama_engine&) = delete;

  using seq_id = std::int32_t;

  /// Plans a request (reuse by `strategy`), fetches and copies its reused blocks, computes
  /// nothing yet; the sequence is live until close(). `extras` salt its keys (tenant, adapter)
  /// and `principal` names its sender for the provenance policy, as relocatable_cache::plan
  /// takes them. `stats`, when given, gets the plan's counts (prefill_step adds the work).
  /// @throws out_of_blocks when the pool cannot hold it now (nothing kept);
  ///         std::out_of_range for a token outside the vocabulary
  seq_id open(const relokv::request_layout& layout, const relokv::recompute::any_strategy& strategy,
              prefill_stats* stats = nullptr, const relokv::extra_keys& extras = {},
              std::uint64_t principal = 0);
  /// Computes up to `max_rows` more of the sequence's prompt rows (all of them for a strategy
  /// that measures or probes across the whole prompt: dynamic, question_topk, APE) and returns
  /// the last token's logits once the prompt is done, else an empty vector. Chunks are exact:
  /// a static strategy's prompt in chunks gives the bits it gives at once.
  std::vector<float> prefill_step(seq_id s, std::int32_t max_rows, prefill_stats* stats = nullptr);
  /// Prompt rows the sequence still has to compute (0 once its logits were returned).
  [[nodiscard]] std::int32_t prefill_remaining(seq_id s) const;
  /// Reserves the next position of a prefilled sequence for `token`. False when the pool has
  /// no block for it now (nothing changed: preempt or wait, then call again).
  [[nodiscard]] bool append(seq_id s, relokv::token_t token);
  /// Computes the appended token of every sequence in `seqs` in one forward (one product per
  /// weight matrix over all rows, attention per sequence) and returns their logits, in order.
  /// A row's logits are the bits its sequence decoded alone would give.
  std::vector<std::vector<float>> decode_step(std::span<const seq_id> seqs);
  /// Registers a prefilled sequence's prompt blocks for reuse now (and writes new ones to the
  /// store), while it goes on decoding: a request that arrives during its answer reuses its
  /// spans. Only the prompt's sealed blocks are registered (decode writes private blocks).
  /// Idempotent. @throws std::logic_error for an unknown id or a prompt not computed to its end
  void commit(seq_id s);
  /// Ends a sequence: `commit` registers its blocks for reuse (and writes new ones to the
  /// store) unless commit(s) did already, then they are released. Unknown ids are ignored.
  void close(seq_id s, bool commit);
  /// The blocks a live sequence reads, in order: {pool block, first position, valid slots}
  /// (its KV is kv()'s rows of those blocks). @throws std::logic_error for an unknown id
  [[nodiscard]] std::vector<relokv::block_entry> block_table(seq_id s) const;
  /// The one-request loop's live sequence (prefill() to end()), or -1.
  [[nodiscard]] seq_id current() const noexcept { return current_; }
  /// Live sequences.
  [[nodiscard]] std::int32_t live() const noexcept {
    return static_cast<std::int32_t>(seqs_.size());
  }

  /// Prefills a request (planning reuse with `strategy`) and returns the logits of its last
  /// token; the request stays live for decode until end(). `extras` salt its keys (tenant,
  /// adapter) and `principal` names its sender for the provenance policy, as
  /// relocatable_cache::plan takes them.
  std::vector<float> prefill(const relokv::request_layout& layout,
                             const relokv::recompute::any_strategy& strategy,
                             prefill_stats* stats = nullptr, const relokv::extra_keys& extras = {},
                             std::uint64_t principal = 0);
  /// Appends one token to the live request and returns the next logits.
  std::vector<float> decode(relokv::token_t token);
  /// Greedy generation: up to max_tokens, stopping after `stop` (if >= 0).
  std::vector<relokv::token_t> generate(const std::vector<float>& first_logits,
                                        std::int32_t max_tokens, relokv::token_t stop = -1);
  /// Commits the live request's new blocks (reusable by later requests) and ends it.
  void end(bool commit = true);

  [[nodiscard]] cache_type& cache() noexcept { return cache_; }
  /// The fingerprint this engine's stored blocks carry (model, RoPE, placement).
  [[nodiscard]] std::uint64_t store_fingerprint() const noexcept;
  [[nodiscard]] const llama_model& model() const noexcept { return *model_; }
  /// The KV pool ([layer][block][k|v][head][slot][dim]), for tests and tools that inspect it.
  [[nodiscard]] const relokv::host_kv_storage<T>& kv() const noexcept { return kv_; }

 private:
  struct live_request;
  live_request& seq(seq_id s, const char* what) const;

  std::shared_ptr<const llama_model> model_;
  relokv::layer_rope rope_;  ///< each layer's RoPE table and window
  relokv::host_kv_storage<T> kv_;
  cache_type cache_;
  std::map<seq_id, std::unique_ptr<live_request>> seqs_;
  seq_id next_ = 0;
  seq_id current_ = -1;  ///< the one-request loop's sequence (prefill, decode, end)
};

// Instantiated in llama.cpp for the three shipped placements, KV in bf16 and in fp32.
extern template class llama_engine<relokv::pre_rotated, relokv::bf16>;
extern template class llama_engine<relokv::at_attention, relokv::bf16>;
extern template class llama_engine<relokv::block_relative, relokv::bf16>;
extern template class llama_engine<relokv::pre_rotated, float>;
extern template class llama_engine<relokv::at_attention, float>;
extern template class llama_engine<relokv::block_relative, float>;

/// Prefill without relokv: no cache, no plan, no block table of many blocks. The KV of each
/// layer is one contiguous buffer (a single block as long as the longest prompt, keys rotated
/// as they are written, as an engine without relocation stores them), and the buffer and the
/// RoPE table are allocated once, at construction, like an engine's pool. The baseline that
/// engine_relokv_overhead divides by: same layer loop, same KV type, nothing of relokv's.
template <class T = relokv::bf16>
class contiguous_prefill {
 public:
  /// @throws std::invalid_argument when max_tokens < 1
  contiguous_prefill(std::shared_ptr<const llama_model> m, std::int32_t max_tokens);
  ~contiguous_prefill();
  contiguous_prefill(contiguous_prefill&&) noexcept;
  contiguous_prefill& operator=(contiguous_prefill&&) noexcept;
  /// The logits of the last token of `tokens` (1 to max_tokens of them).
  /// @throws std::out_of_range for a token outside the vocabulary; std::invalid_argument for
  ///         an empty prompt or one longer than max_tokens
  std::vector<float> operator()(const std::vector<relokv::token_t>& tokens);

 private:
  struct state;
  std::unique_ptr<state> s_;
};
extern template class contiguous_prefill<relokv::bf16>;
extern template class contiguous_prefill<float>;

/// contiguous_prefill<float> of one prompt (allocating for it): the fp32 reference the tests
/// compare the engine with. Returns the logits of the last token.
std::vector<float> plain_prefill(const llama_model& m, const std::vector<relokv::token_t>& tokens);
/// @throws std::out_of_range naming `where`, the index and the id of the first token outside
///         [0, vocab). The engine's entry points (prefill, decode, plain_prefill) call it.
void check_tokens(const llama_model& m, std::span<const relokv::token_t> tokens, const char* where);

/// Index of the largest logit.
relokv::token_t argmax(const std::vector<float>& logits);

}  // namespace relokv_engine
