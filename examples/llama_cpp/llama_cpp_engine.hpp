#pragma once
// relokv in charge of a llama.cpp context. relokv's layout says what may be reused, its keys
// find the spans, its verification and tenant salts apply, and its pool and LRU decide which
// blocks stay resident (host memory, in llama.cpp's own K/V bytes); llama.cpp computes and
// holds the K/V of the request being served.
//
// A request: plan with relokv; load each run of cached blocks into a scratch sequence of the
// context (llama_state_seq_set_data), move it to its new position with llama.cpp's own K-shift
// (llama_memory_seq_add: the keys are stored rotated at the position they were computed at,
// relokv's pre_rotated placement); then walk the prompt in position order, sharing each loaded
// run into the request's sequence (llama_memory_seq_cp) and decoding each run of tokens the
// strategy recomputes at its positions. Blocks the request computed go back to relokv's pool
// (llama_state_seq_get_data) when it commits.
//
// Strategies: none, first_k (EPIC), seam_window (KVBoost's window) and full run here. CacheBlend
// (deviation_topk and the union), question_topk and APE need a hook between layers (the K/V
// deviation or the attention mass at a layer, or per-group attention), which llama.cpp's public
// API does not offer; the engine refuses them with a message that says so.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/hash/xxh3.hpp>
#include <relokv/memory/lru_block_pool.hpp>
#include <relokv/recompute/any_strategy.hpp>
#include <relokv/rope/pre_rotated.hpp>
#include <relokv/store/any_store.hpp>

#include "links.hpp"     // relokv_engine::link_adapter
#include "sequence.hpp"  // relokv_engine::prefill_stats

namespace relokv_llama_cpp {

struct engine_options {
  std::int32_t num_blocks = 4096;  ///< relokv's pool: blocks cached in host memory
  std::int32_t block_size = 16;
  std::int32_t n_ctx = 4096;   ///< llama.cpp's context cells: the longest request plus its answer
  std::int32_t n_batch = 512;  ///< llama.cpp's logical (and physical) batch
  std::int32_t n_threads = 0;  ///< 0: every hardware thread
  /// Where spans outlive the process (empty: the pool only).
  relokv::any_store store;
  /// A span-link adapter (relokv_engine::load_links, checked against the same GGUF): ids
  /// n_vocab() .. n_vocab() + links->n - 1 are its rows, given to llama.cpp as embeddings
  /// (llama_batch.embd; a batch holds either ids or rows, so a run of rows is a call of its
  /// own). llama.cpp applies no embedding scale to rows (Gemma 3 included), which is how the
  /// adapter was trained.
  std::shared_ptr<const relokv_engine::link_adapter> links;
};

/// One llama.cpp context served through relokv.
/// @tparam T the KV element type, llama.cpp's and the pool's: relokv::fp16 (llama.cpp's
///           default, GGML_TYPE_F16) or float (GGML_TYPE_F32)
template <class T>
class engine final : public relokv_engine::sequence_engine {
 public:
  using cache_type =
      relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool, relokv::pre_rotated,
                                relokv::recompute::any_strategy, relokv::any_store>;

  /// Loads the GGUF with llama.cpp and makes its context.
  /// @throws std::runtime_error when llama.cpp cannot load the model or make the context, or
  ///         when the context's KV is not what the adapter reads (not shiftable, M-RoPE, another
  ///         image format)
  engine(const std::string& gguf_path, engine_options opt = {});
  ~engine() override;
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // relokv_engine::sequence_engine, one sequence at a time (a llama.cpp context's sequence 0
  // and its load waves); prefill(), decode() and end() are sequence_engine's loop over them.
  /// Plans a request (reuse planned with `strategy`) and computes nothing. `extras` salt its
  /// keys (a tenant, a LoRA: relokv::extra_keys), `principal` is who sent it (the provenance
  /// policy serves a span computed in another's context only to that principal): both as
  /// relocatable_cache::plan takes them.
  /// @throws relokv_engine::out_of_blocks while another is live, or when the pool has too few
  ///         free blocks (nothing was taken); std::invalid_argument for a strategy that needs a
  ///         per-layer hook, a token outside the vocabulary (or the adapter's rows) or a request
  ///         longer than the context (nothing is planned then)
  seq_id open(const relokv::request_layout& layout, const relokv::recompute::any_strategy& strategy,
              relokv_engine::prefill_stats* stats, const relokv::extra_keys& extras,
              std::uint64_t principal) override;
  /// Walks the prompt on in position order: cached runs loaded (no rows), at most `max_rows`
  /// computed rows decoded; the last token's logits once the prompt is done, else empty. The
  /// logits are the same bits in steps of any size (llama.cpp computes each row over the cells
  /// before it).
  std::vector<float> prefill_step(seq_id s, std::int32_t max_rows,
                                  relokv_engine::prefill_stats* stats) override;
  /// Nothing to share while it decodes (one sequence at a time): close() commits.
  void commit(seq_id /*s*/) override {}
  /// False when the context has no cell left for it.
  [[nodiscard]] bool append(seq_id s, relokv::token_t token) override;
  std::vector<std::vector<float>> decode_step(std::span<const seq_id> seqs) override;
  /// Ends the live sequence `s` (other ids are ignored): `commit` registers its prompt blocks
  /// for reuse (written to the store when there is one; not a prompt whose prefill was not
  /// finished).
  void close(seq_id s, bool commit) override;
  [[nodiscard]] std::int32_t live() const noexcept override;

  /// llama.cpp alone: the tokens prefilled from position 0 in batches of n_batch, in a cleared
  /// context (no relokv), and the last token's logits. The reference and the baseline.
  std::vector<float> plain_prefill(std::span<const relokv::token_t> tokens);

  [[nodiscard]] cache_type& cache() noexcept;
  [[nodiscard]] std::int32_t n_vocab() const noexcept;
  [[nodiscard]] std::int32_t n_layers() const noexcept override;
  /// The fingerprint this engine's stored blocks carry: the GGUF file's bytes, llama.cpp and
  /// its KV type, and the placement.
  [[nodiscard]] std::uint64_t store_fingerprint() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

extern template class engine<relokv::fp16>;
extern template class engine<float>;

}  // namespace relokv_llama_cpp
