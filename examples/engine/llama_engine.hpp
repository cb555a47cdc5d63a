#pragma once
// A small Llama-family forward pass on relokv: paged KV through relokv's host attention, reuse
// plans from relocatable_cache honoured (only the masked tokens are computed; dynamic strategies
// refined layer by layer), fp32 activations, weights in their GGUF types (qgemm.hpp). The model
// is model.hpp's; the sequence calls are sequence.hpp's.
#include <cstdint>
#include <map>
#include <memory>
#include <span>
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

#include "model.hpp"
#include "sequence.hpp"

namespace relokv_engine {

/// One engine instance: a model, a paged KV pool and a relocatable_cache over it.
///
/// Many requests may be live at once (a server's batch), each a sequence: open() plans one
/// and loads its reused blocks, prefill_step() computes its prompt in chunks, append() and
/// decode_step() advance any set of sequences by one token in one forward, close() commits or
/// releases it. prefill(), decode() and end() (sequence_engine's) are the one-request loop.
/// One thread drives an engine (it owns the cache); the forward passes use the two lanes.
/// @tparam P RoPE placement of the stored keys
/// @tparam T the KV pool's element type: bf16 (the default: the host attention's fast path,
///           half the bytes) or float
template <class P, class T = relokv::bf16>
class llama_engine final : public sequence_engine {
 public:
  using cache_type = relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool, P,
                                               relokv::recompute::any_strategy, relokv::any_store>;

  /// @param store  where spans outlive the process (empty: the pool only). Pool misses are
  ///               looked up there, and the blocks a request computes are written at end().
  llama_engine(std::shared_ptr<const llama_model> model, std::int32_t num_blocks,
               std::int32_t block_size = 16, relokv::any_store store = {});
  ~llama_engine() override;
  llama_engine(const llama_engine&) = delete;
  llama_engine& operator=(const llama_engine&) = delete;

  using sequence_engine::seq_id;

  /// Plans a request (reuse by `strategy`), fetches and copies its reused blocks, computes
  /// nothing yet; the sequence is live until close(). `extras` salt its keys (tenant, adapter)
  /// and `principal` names its sender for the provenance policy, as relocatable_cache::plan
  /// takes them. `stats`, when given, gets the plan's counts (prefill_step adds the work).
  /// @throws out_of_blocks when the pool cannot hold it now (nothing kept);
  ///         std::out_of_range for a token outside the vocabulary
  seq_id open(const relokv::request_layout& layout, const relokv::recompute::any_strategy& strategy,
              prefill_stats* stats = nullptr, const relokv::extra_keys& extras = {},
              std::uint64_t principal = 0) override;
  /// Computes up to `max_rows` more of the sequence's prompt rows (all of them for a strategy
  /// that measures or probes across the whole prompt: dynamic, question_topk, APE) and returns
  /// the last token's logits once the prompt is done, else an empty vector. Chunks are exact:
  /// a static strategy's prompt in chunks gives the bits it gives at once.
  std::vector<float> prefill_step(seq_id s, std::int32_t max_rows,
                                  prefill_stats* stats = nullptr) override;
  /// Prompt rows the sequence still has to compute (0 once its logits were returned).
  [[nodiscard]] std::int32_t prefill_remaining(seq_id s) const;
  /// Reserves the next position of a prefilled sequence for `token`. False when the pool has
  /// no block for it now (nothing changed: preempt or wait, then call again).
  [[nodiscard]] bool append(seq_id s, relokv::token_t token) override;
  /// Computes the appended token of every sequence in `seqs` in one forward (one product per
  /// weight matrix over all rows, attention per sequence) and returns their logits, in order.
  /// A row's logits are the bits its sequence decoded alone would give.
  std::vector<std::vector<float>> decode_step(std::span<const seq_id> seqs) override;
  /// Registers a prefilled sequence's prompt blocks for reuse now (and writes new ones to the
  /// store), while it goes on decoding: a request that arrives during its answer reuses its
  /// spans. Only the prompt's sealed blocks are registered (decode writes private blocks).
  /// Idempotent. @throws std::logic_error for an unknown id or a prompt not computed to its end
  void commit(seq_id s) override;
  /// Ends a sequence: `commit` registers its blocks for reuse (and writes new ones to the
  /// store) unless commit(s) did already, then they are released. Unknown ids are ignored.
  void close(seq_id s, bool commit) override;
  /// The blocks a live sequence reads, in order: {pool block, first position, valid slots}
  /// (its KV is kv()'s rows of those blocks). @throws std::logic_error for an unknown id
  [[nodiscard]] std::vector<relokv::block_entry> block_table(seq_id s) const;
  /// Live sequences.
  [[nodiscard]] std::int32_t live() const noexcept override {
    return static_cast<std::int32_t>(seqs_.size());
  }
  [[nodiscard]] std::int32_t n_layers() const noexcept override { return model_->cfg.n_layers; }

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
};

// Instantiated in llama_engine.cpp for the three shipped placements, KV in bf16 and in fp32.
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
}  // namespace relokv_engine
