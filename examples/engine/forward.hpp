#pragma once
// The example engine's forward pass, internal to it (llama.cpp and forward.cpp): the products
// in the weights' own types, the layer loop over paged KV, batched decode rows, the logits.
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

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

/// One prefill pass over the layers of one request, named: what run_layers computes and where.
/// Set the request's four (model, ropes, kv, map), its tokens and the positions; a static
/// strategy needs nothing else.
template <class T>
struct layer_pass {
  const llama_model* model = nullptr;
  const relokv::layer_rope* ropes = nullptr;
  relokv::host_kv_storage<T>* kv = nullptr;
  const kv_map* map = nullptr;  ///< where each position's K/V is, and the blocks attended
  const std::vector<relokv::token_t>* tokens = nullptr;  ///< the request's, by position
  /// The positions computed, ascending (a chunk of the prompt; a dynamic strategy's set shrinks
  /// layer by layer).
  std::vector<std::int32_t> positions;
  /// A position computed but not written (the reused last token); -1: none.
  std::int32_t no_write = -1;
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
};

/// The layer loop of one request. Computes the tokens at `pass.positions` (their K/V written
/// where `map` says, except at `no_write`), attends over every block of `map`, and leaves the
/// last token's hidden state in last_hidden. With a dynamic strategy the set shrinks layer by
/// layer (mask/reused per position). Positions may come in chunks, in order: a chunk's queries
/// see the keys the earlier chunks wrote (causal attention reads no later key), so a static
/// strategy's prompt computed in chunks is the prompt computed at once. Prefill only: decode
/// rows go through run_decode_rows.
template <class P, class T>
void run_layers(layer_pass<T> pass, std::vector<float>& last_hidden);

/// One decode row of a sequence: its last token, at its position, over its blocks.
struct decode_row {
  const kv_map* map;
  relokv::token_t token;
  std::int32_t pos;
  const grouped_reader* reader = nullptr;  ///< APE's reader, or none
};
/// One decode step of many sequences in one forward: the products over all rows, attention
/// per row over its own blocks (as a lone decode attends). hidden gets rows.size() x dim.
template <class P, class T>
void run_decode_rows(const llama_model& m, const relokv::layer_rope& ropes,
                     relokv::host_kv_storage<T>& kv, std::span<const decode_row> rows,
                     std::vector<float>& hidden);

/// The logits of n hidden states (rows of dim): final norm, then the output matrix.
std::vector<float> head(const llama_model& m, const std::vector<float>& hidden, bool decode,
                        int n = 1);

}  // namespace relokv_engine::detail
