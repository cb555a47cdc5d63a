#pragma once
// llama.cpp's image of one sequence's KV cells, as llama_state_seq_get_data() writes it and
// llama_state_seq_set_data() reads it (llama.cpp of llama-cpp-python 0.3.36, one stream, no
// per-cell extension: not M-RoPE). This is how K/V leave and enter a llama.cpp context through
// its public API; the adapter checks every field against what it expects, so another version's
// format fails loudly instead of being misread.
//
//   u32 magic (0xaf143cd8)   i32 seq   u32 n_stream (1)   u32 cell_count
//   cell_count x { i32 pos, u32 n_seq (1), i32 seq }
//   u32 v_trans, u32 n_layer
//   n_layer x { i32 k_type, u64 k_row_bytes, cell_count rows }
//   v_trans = 0: n_layer x { i32 v_type, u64 v_row_bytes, cell_count rows }
//   v_trans = 1: n_layer x { i32 v_type, u32 elem_bytes, u32 n_embd_v, n_embd_v x cell_count elems
//   }
// A sliding-window model's context (llama.cpp's iSWA cache, its window kept whole: swa_full)
// writes two caches after the magic and the sequence, each from n_stream on: its global
// layers', then its windowed layers', each with its own n_layer (image_geometry::parts). The
// windowed cache leaves out the cells behind the window of the sequence's last position, so
// the adapter reads a sequence a window at a time (the parser wants the same cells in both).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace relokv_llama_cpp {

/// What each layer of an image holds: the element type (ggml's enum value) and the bytes of one
/// cell's K row, which is also its V row (n_kv_heads * head_dim elements).
struct image_geometry {
  std::int32_t n_layers = 0;
  std::int32_t ggml_type = 0;
  std::int32_t elem_bytes = 0;
  std::int32_t row_elems = 0;
  /// The images a sequence's state is made of, in order, each the model layers its cache holds
  /// (ascending): empty means one image of every layer; a sliding-window model has two, its
  /// global layers then its windowed ones.
  std::vector<std::vector<std::int32_t>> parts;
  [[nodiscard]] std::size_t row_bytes() const noexcept {
    return static_cast<std::size_t>(row_elems) * static_cast<std::size_t>(elem_bytes);
  }
  /// parts, or the one part of every layer.
  [[nodiscard]] std::vector<std::vector<std::int32_t>> layer_parts() const;
};

/// A parsed image: each cell's position, and its K and V rows per layer.
class seq_image {
 public:
  /// @throws std::runtime_error naming the first field that differs from `g` or the format
  ///         (a truncated image, trailing bytes, another stream count or element type)
  static seq_image parse(std::vector<std::uint8_t> bytes, const image_geometry& g);

  [[nodiscard]] std::int32_t cells() const noexcept {
    return static_cast<std::int32_t>(pos_.size());
  }
  [[nodiscard]] std::int32_t pos(std::int32_t cell) const noexcept {
    return pos_[static_cast<std::size_t>(cell)];
  }
  [[nodiscard]] bool v_trans() const noexcept { return v_trans_; }
  /// Copies cell `cell`'s K (v = false) or V row of `layer` to out (row_bytes()).
  void row(std::int32_t layer, std::int32_t cell, bool v, std::byte* out) const;

 private:
  std::vector<std::uint8_t> bytes_;
  image_geometry g_;
  std::vector<std::int32_t> pos_;
  std::vector<std::size_t> k_at_, v_at_;  // per model layer: offset of cell 0's data
  bool v_trans_ = false;
};

/// Fills one cell's K (v = false) or V row of a layer (row_bytes() bytes).
using row_source =
    std::function<void(std::int32_t layer, std::int32_t cell, bool v, std::byte* out)>;
/// An image of pos.size() cells of sequence `seq` for llama_state_seq_set_data, V transposed
/// or not as the context holds it (v_trans).
std::vector<std::uint8_t> write_image(std::span<const std::int32_t> pos, std::int32_t seq,
                                      bool v_trans, const image_geometry& g,
                                      const row_source& rows);

}  // namespace relokv_llama_cpp
