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
#include "llama.hpp"

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

/// The layer loop of one request. Computes the tokens at `positions` (ascending; their K/V are
/// written where `map` says, except where `no_write`), attends over every block of `map`, and
/// leaves the last token's hidden state in last_hidden. With a dynamic strategy the set
/// shrinks layer by layer (mask/reused per position). Positions may come in chunks, in order:
/// a chunk's queries see the keys the earlier chunks wrote (causal attention reads no later
/// key), so a static strategy's prompt computed in chunks is the prompt computed at once.
/// Prefill only: decode rows go through run_decode_rows.
template <class P, class T>
void run_layers(const llama_model& m, const relokv::layer_rope& ropes,
                relokv::host_kv_storage<T>& kv, const kv_map& map,
                std::vector<std::int32_t> positions, const std::vector<relokv::token_t>& tokens,
                std::int32_t no_write, std::vector<std::uint8_t>* mask,
                const std::vector<std::uint8_t>* reused,
                const relokv::recompute::any_strategy* strategy, std::vector<float>& last_hidden,
                prefill_stats* trace = nullptr, const std::vector<std::uint8_t>* pinned = nullptr,
                const mass_probe* probe = nullptr, const grouped_reader* reader = nullptr);

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
