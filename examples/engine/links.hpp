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

/// A span-link adapter: rows the first layer reads as they are (no embedding scale) for ids
/// model vocab .. vocab + n - 1; its header rows come first, then its link rows.
struct link_adapter {
  std::vector<float> rows;  ///< [n][dim]
  std::int32_t n = 0, dim = 0;
  std::int32_t header = 0;           ///< rows compiled before each span
  std::int32_t before_question = 0;  ///< rows computed before the question
  std::uint64_t id = 0;              ///< the file's identity: XXH3 of its bytes (never 0)
  std::string path, model_sha256, placement;

  /// What layout_builder::links takes for a model of vocabulary `vocab`.
  [[nodiscard]] relokv::link_rows layout_rows(std::int32_t vocab) const {
    return relokv::link_rows{id, vocab, header, before_question};
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
