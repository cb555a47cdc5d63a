#pragma once
// The example engine's forward pass, internal to it (llama_engine.cpp and forward.cpp): the
// products in the weights' own types, the layer loop over paged KV, batched decode rows, the
// logits.
#include <cstdint>
#include <initializer_list>
#include <span>
#include <utility>
#include <vector>

#include <relokv/attention/params.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/recompute/any_strategy.hpp>
#include <relokv/rope/layer_rope.hpp>
#include <relokv/rope/rotate.hpp>
#include <relokv/types.hpp>

#include "layer_attention.hpp"
#include "llama_engine.hpp"

namespace relokv_engine::detail {

/// One product of matmuls(): Y[n][w.rows] = X W^T (+ bias when given and not empty).
struct product {
  const qmatrix* w;
  float* y;
  const std::vector<float>* bias = nullptr;
};

/// Products of the same X[n][in] in one handover to the two lanes (forward.cpp says which
/// kernels serve prefill and decode). Every path is batch-invariant: a row's outputs do not
/// depend on the rows computed with it. Decode calls of more than kIntegerMaxRows rows (a
/// server's batch) run in groups of at most that many, each on the integer kernels a row
/// decoded alone takes.
void matmuls(const float* x, int n, int in, std::span<const product> ps, bool decode,
             bool logits = false);
inline void matmuls(const float* x, int n, int in, std::initializer_list<product> ps, bool decode,
                    bool logits = false) {
  matmuls(x, n, in, std::span<const product>(ps.begin(), ps.size()), decode, logits);
}
void rmsnorm(const float* x, const std::vector<float>& w, int dim, float eps, float* out);

/// Where a pass writes K/V and what its attention reads, by position: the engine's live
/// request (its relokv::request_kv: slot_at, write, attention) or the contiguous baseline's
/// one block of its own.
template <class T>
class pass_kv {
 public:
  virtual ~pass_kv() = default;
  /// Writes position pos's K and V ([kv heads][head_dim] each, unrotated) into layer l as the
  /// placement stores them; nothing where the request reuses the token (its K/V are cached).
  virtual void write(std::int32_t l, std::int32_t pos, const float* k, const float* v) = 0;
  /// Layer l's attention call with what the request decides set: RoPE table, window, KV view
  /// and block table (relokv::request_kv::attention).
  [[nodiscard]] virtual relokv::attention_params<T> attention(std::int32_t l) const = 0;
  /// Where position pos's K/V are: its block and its slot in it.
  [[nodiscard]] virtual std::pair<relokv::block_id, std::int32_t> where(std::int32_t pos) const = 0;

 protected:
  pass_kv() = default;
  pass_kv(const pass_kv&) = default;
  pass_kv& operator=(const pass_kv&) = default;
};

/// One prefill pass over the layers of one request, named: what run_layers computes and where.
/// Set the request's three (model, kv, tokens) and the positions; a static strategy needs
/// nothing else.
template <class T>
struct layer_pass {
  const llama_model* model = nullptr;
  pass_kv<T>* kv = nullptr;  ///< where the K/V go and what attention reads
  const std::vector<relokv::token_t>* tokens = nullptr;  ///< the request's, by position
  /// The positions computed, ascending (a chunk of the prompt; a dynamic strategy's set shrinks
  /// layer by layer).
  std::vector<std::int32_t> positions;
  /// A dynamic strategy (CacheBlend's deviation check, APE's groups) and its per-position
  /// state: `mask` the positions still computed (it shrinks), `reused` those loaded from the
  /// cache, `pinned` those a combined strategy computes at every layer. All or none.
  const relokv::recompute::any_strategy* strategy = nullptr;
  std::vector<std::uint8_t>* mask = nullptr;
  const std::vector<std::uint8_t>* reused = nullptr;
  const std::vector<std::uint8_t>* pinned = nullptr;
  prefill_stats* trace = nullptr;          ///< what each layer computed, when wanted
  const mass_probe* probe = nullptr;       ///< question_topk's probe of the question's attention
  const grouped_reader* reader = nullptr;  ///< APE's reader of grouped spans
  /// Per position, 1 for a span's own token (not a link row): what an adapter's low-rank
  /// correction changes (links.hpp). Needed when the model's adapter has one.
  const std::vector<std::uint8_t>* span_rows = nullptr;
};

/// The layer loop of one request. Computes the tokens at `pass.positions` (their K/V written
/// through `pass.kv`, which skips the tokens the request reuses), attends over every block of
/// the request, and leaves the
/// last token's hidden state in last_hidden. With a dynamic strategy the set shrinks layer by
/// layer (mask/reused per position). Positions may come in chunks, in order: a chunk's queries
/// see the keys the earlier chunks wrote (causal attention reads no later key), so a static
/// strategy's prompt computed in chunks is the prompt computed at once. Prefill only: decode
/// rows go through run_decode_rows.
template <class P, class T>
void run_layers(layer_pass<T> pass, std::vector<float>& last_hidden);

/// One decode row of a sequence: its last token, at its position, over its blocks.
template <class T>
struct decode_row {
  pass_kv<T>* kv;
  relokv::token_t token;
  std::int32_t pos;
  const grouped_reader* reader = nullptr;  ///< APE's reader, or none
};
/// One decode step of many sequences in one forward: the products over all rows, attention
/// per row over its own blocks (as a lone decode attends). hidden gets rows.size() x dim.
template <class P, class T>
void run_decode_rows(const llama_model& m, std::span<const decode_row<T>> rows,
                     std::vector<float>& hidden);

/// The logits of n hidden states (rows of dim): final norm, then the output matrix.
std::vector<float> head(const llama_model& m, const std::vector<float>& hidden, bool decode,
                        int n = 1);

}  // namespace relokv_engine::detail
