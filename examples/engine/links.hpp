#pragma once
// Span links in the engine: an adapter's learned rows (tools/links), read for ids past the
// model's vocabulary. See docs/strategies.md "Links".
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <relokv/layout/builder.hpp>

namespace relokv_engine {

struct llama_model;

/// A span-link adapter: learned rows for ids model vocab .. vocab + n - 1, in the order header
/// rows (compiled before each span), trailer rows (compiled after each span), then the rows
/// before the question. Two depths (docs/strategies.md "Links"):
/// - embedding (shallow): `rows` are what the first layer reads for the id (no embedding
///   scale); every layer computes the row's keys and values from it;
/// - kv (deep): `kv` gives every layer's key (before RoPE, as the pool stores it unrotated) and
///   value of the row; the engine writes those in place of what it computed (the row's hidden
///   state is read by nothing else).
/// It may also hold a deep low-rank correction of every span's own tokens (docs/links.md): at
/// each layer from `lowrank_from` on, a span token's key gets (h a) b_k and its value (h a) b_v
/// added, h the token's attention input; computed when the span is, cached and relocated with
/// it. An adapter may hold a correction and no rows.
struct link_adapter {
  std::vector<float> rows;  ///< [n][dim] (zeros for a deep adapter)
  std::vector<float> kv;    ///< deep only: [n][layers][2][kv_heads * head_dim], K then V
  std::int32_t n = 0, dim = 0;
  std::int32_t header = 0;              ///< rows compiled before each span
  std::int32_t trailer = 0;             ///< rows compiled after each span
  std::int32_t before_question = 0;     ///< rows computed before the question
  std::int32_t layers = 0, kv_dim = 0;  ///< the model's: the shape of kv and of lowrank_b
  bool deep = false;                    ///< relokv.links.depth "kv"
  std::int32_t lowrank = 0;             ///< the correction's rank (0: none)
  std::int32_t lowrank_from = 0;        ///< the first layer it corrects
  std::vector<float> lowrank_a;         ///< [layers - lowrank_from][dim][lowrank]
  std::vector<float> lowrank_b;         ///< [layers - lowrank_from][lowrank][2 * kv_dim], K|V
  std::uint64_t id = 0;                 ///< the file's identity: XXH3 of its bytes (never 0)
  std::string path, model_sha256, placement;

  /// What layout_builder::links takes for a model of vocabulary `vocab`.
  [[nodiscard]] relokv::link_rows layout_rows(std::int32_t vocab) const {
    return relokv::link_rows{id, vocab, header, before_question, trailer};
  }
  /// The correction's a and b at layer l (>= lowrank_from).
  [[nodiscard]] const float* lowrank_a_at(std::int32_t l) const {
    return lowrank_a.data() + static_cast<std::size_t>(l - lowrank_from) *
                                  static_cast<std::size_t>(dim) * static_cast<std::size_t>(lowrank);
  }
  [[nodiscard]] const float* lowrank_b_at(std::int32_t l) const {
    return lowrank_b.data() + static_cast<std::size_t>(l - lowrank_from) *
                                  static_cast<std::size_t>(lowrank) * 2 *
                                  static_cast<std::size_t>(kv_dim);
  }
  /// Deep: row r's key (then value, kv_dim further) at layer l.
  [[nodiscard]] const float* kv_row(std::int32_t r, std::int32_t l) const {
    return kv.data() + ((static_cast<std::size_t>(r) * static_cast<std::size_t>(layers) +
                         static_cast<std::size_t>(l)) *
                        2 * static_cast<std::size_t>(kv_dim));
  }
};

/// Reads an adapter (GGUF, tools/links/links/adapter.py's format) and checks it against the
/// model it will serve: dimension, vocabulary, architecture, finite rows.
/// @throws gguf_error for a file that is not a well-formed adapter; std::invalid_argument for
///         one made for another model (naming what differs)
std::shared_ptr<const link_adapter> load_links(const std::string& path, const llama_model& m);

/// The model with the adapter's rows (a copy that shares the weights' mapping).
std::shared_ptr<const llama_model> with_links(std::shared_ptr<const llama_model> m,
                                              std::shared_ptr<const link_adapter> a);

}  // namespace relokv_engine
