#pragma once
/// @file
/// Each layer's RoPE table and attention window. Llama and Qwen2 have one RoPE and no window;
/// Gemma 2 and 3, Mistral's sliding window, GPT-OSS and Llama 4 interleave windowed layers
/// with global ones and give each kind its own RoPE (Gemma 3: base 10,000 and a 512-token
/// window on five layers in six, base 1,000,000 and no window on the sixth).
///
/// @code
///   std::vector<relokv::layer_rope::layer> layers(18);
///   for (int l = 0; l < 18; ++l)
///     layers[l] = (l + 1) % 6 == 0 ? relokv::layer_rope::layer{global, 0}
///                                  : relokv::layer_rope::layer{local, 512};
///   relokv::layer_rope geometry(layers, 8192);  // one table per distinct config
///   relokv::request_kv req(cache, storage, geometry, layout, std::move(plan));
/// @endcode
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN

class layer_rope {
 public:
  /// One layer: its RoPE and its sliding window (0: global attention).
  struct layer {
    rope_config rope;
    std::int32_t window = 0;
  };

  /// Every layer alike: one table, no window.
  layer_rope(const rope_config& rope, std::int32_t num_layers, std::int32_t max_position = 8192)
      : layer_rope(std::vector<layer>(static_cast<std::size_t>(num_layers < 0 ? 0 : num_layers),
                                      layer{rope, 0}),
                   max_position) {}

  /// One table per distinct RoPE configuration, shared by the layers that have it.
  /// @throws error for a bad configuration (rope_config::validate), a negative window, no
  ///         layers, or layers whose head_dim differs
  layer_rope(std::span<const layer> layers, std::int32_t max_position = 8192) {
    if (layers.empty()) throw error("layer_rope: a model has at least one layer");
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const layer& x = layers[l];
      if (x.window < 0)
        throw error("layer_rope: layer " + std::to_string(l) + " has a negative window (" +
                    std::to_string(x.window) + ")");
      if (x.rope.head_dim != layers[0].rope.head_dim)
        throw error("layer_rope: layer " + std::to_string(l) + " has head_dim " +
                    std::to_string(x.rope.head_dim) + ", layer 0 " +
                    std::to_string(layers[0].rope.head_dim));
      std::size_t t = 0;
      while (t < tables_.size() && !(tables_[t]->config() == x.rope)) ++t;
      if (t == tables_.size())
        tables_.push_back(std::make_unique<rope_table>(x.rope, max_position));
      index_.push_back(static_cast<std::int32_t>(t));
      window_.push_back(x.window);
    }
  }

  [[nodiscard]] std::int32_t num_layers() const noexcept {
    return static_cast<std::int32_t>(index_.size());
  }
  /// The RoPE table of layer l. @throws error for a layer outside [0, num_layers())
  [[nodiscard]] const rope_table& table(std::int32_t l) const {
    return *tables_[static_cast<std::size_t>(index_[checked(l)])];
  }
  /// The sliding window of layer l (0: global). @throws error as table() does
  [[nodiscard]] std::int32_t window(std::int32_t l) const {
    return window_[static_cast<std::size_t>(checked(l))];
  }
  /// Distinct tables (1 for a Llama; 2 for Gemma 3).
  [[nodiscard]] std::int32_t num_tables() const noexcept {
    return static_cast<std::int32_t>(tables_.size());
  }
  /// One table and no window: the models relokv served before windows.
  [[nodiscard]] bool uniform() const noexcept {
    if (tables_.size() != 1) return false;
    for (const std::int32_t w : window_)
      if (w != 0) return false;
    return true;
  }

 private:
  [[nodiscard]] std::size_t checked(std::int32_t l) const {
    if (l < 0 || l >= num_layers())
      throw error("layer_rope: layer " + std::to_string(l) + " outside [0, " +
                  std::to_string(num_layers()) + ")");
    return static_cast<std::size_t>(l);
  }

  std::vector<std::unique_ptr<rope_table>> tables_;
  std::vector<std::int32_t> index_;   // layer -> table
  std::vector<std::int32_t> window_;  // layer -> window
};

RELOKV_NAMESPACE_END
