#pragma once
/// @file
/// KV bytes on the host, separate from block metadata (lru_block_pool).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "relokv/concepts/kv_store.hpp"
#include "relokv/detail/huge_page_allocator.hpp"
#include "relokv/dtype.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// Shape of a paged KV pool.
struct kv_shape {
  std::int32_t num_layers = 1;
  std::int32_t num_blocks = 1;
  std::int32_t num_kv_heads = 1;
  std::int32_t block_size = 16;
  std::int32_t head_dim = 64;

  /// Elements of one (layer, block, k|v, head) tile: block_size * head_dim.
  [[nodiscard]] constexpr std::size_t tile() const noexcept {
    return static_cast<std::size_t>(block_size) * static_cast<std::size_t>(head_dim);
  }
  /// Elements of one (layer, block): K and V of every head.
  [[nodiscard]] constexpr std::size_t block_elems() const noexcept {
    return 2 * static_cast<std::size_t>(num_kv_heads) * tile();
  }
  [[nodiscard]] constexpr std::size_t layer_elems() const noexcept {
    return static_cast<std::size_t>(num_blocks) * block_elems();
  }
  [[nodiscard]] constexpr std::size_t total_elems() const noexcept {
    return static_cast<std::size_t>(num_layers) * layer_elems();
  }
};

/// Host KV storage, laid out
///   // [layer][block][k|v][kv_head][slot][head_dim]
/// so that one (layer, block, head) tile of K is contiguous: attention streams it.
/// @tparam T float, bf16 or fp16.
template <class T>
class host_kv_storage {
  static_assert(is_storage_type_v<T>, "host_kv_storage<T>: T must be float, bf16 or fp16");

 public:
  using value_type = T;
  /// @throws error naming the dimension when one is not positive, head_dim exceeds
  ///         kMaxHeadDim, or the pool's size in bytes does not fit in 63 bits.
  explicit host_kv_storage(const kv_shape& s) : shape_(s) {
    check_shape(s);
    data_.assign(s.total_elems(), T{});
  }

  /// Checks a shape before anything is sized from it (see the constructor).
  static void check_shape(const kv_shape& s) {
    const std::pair<const char*, std::int32_t> dims[] = {{"num_layers", s.num_layers},
                                                         {"num_blocks", s.num_blocks},
                                                         {"num_kv_heads", s.num_kv_heads},
                                                         {"block_size", s.block_size},
                                                         {"head_dim", s.head_dim}};
    for (const auto& [name, v] : dims)
      if (v <= 0)
        throw error(std::string("host_kv_storage: kv_shape.") + name + " must be positive, got " +
                    std::to_string(v));
    if (s.head_dim > kMaxHeadDim)
      throw error("host_kv_storage: kv_shape.head_dim " + std::to_string(s.head_dim) + " exceeds " +
                  std::to_string(kMaxHeadDim));
    std::uint64_t bytes = sizeof(T) * 2u;
    bool overflow = false;
    for (const auto& d : dims) {
      const auto f = static_cast<std::uint64_t>(d.second);
      overflow = overflow ||
                 bytes > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / f;
      bytes *= f;
    }
    if (overflow)
      throw error("host_kv_storage: kv_shape of " + std::to_string(s.num_layers) + " x " +
                  std::to_string(s.num_blocks) + " x 2 x " + std::to_string(s.num_kv_heads) +
                  " x " + std::to_string(s.block_size) + " x " + std::to_string(s.head_dim) +
                  " elements overflows 64 bits");
  }

  [[nodiscard]] const kv_shape& shape() const noexcept { return shape_; }
  [[nodiscard]] T* data() noexcept { return data_.data(); }
  [[nodiscard]] const T* data() const noexcept { return data_.data(); }

  /// Start of the K (which = 0) or V (which = 1) tile of (layer, block, head): [slot][head_dim].
  [[nodiscard]] T* tile(std::int32_t layer, block_id block, int which, std::int32_t head) noexcept {
    return data_.data() + offset(layer, block, which, head);
  }
  [[nodiscard]] const T* tile(std::int32_t layer, block_id block, int which,
                              std::int32_t head) const noexcept {
    return data_.data() + offset(layer, block, which, head);
  }

  /// Copies every layer of block src into dst (copy on write).
  /// @throws error if either block is outside the pool.
  void copy_block(block_id src, block_id dst) {
    if (src < 0 || src >= shape_.num_blocks || dst < 0 || dst >= shape_.num_blocks)
      throw error("host_kv_storage::copy_block: block " + std::to_string(src) + " -> " +
                  std::to_string(dst) + " outside the pool of " +
                  std::to_string(shape_.num_blocks));
    for (std::int32_t l = 0; l < shape_.num_layers; ++l) {
      const T* s = data_.data() + offset(l, src, 0, 0);
      std::copy(s, s + shape_.block_elems(), data_.data() + offset(l, dst, 0, 0));
    }
  }

  /// The layout a stored block of this storage has (models kv_block_io).
  [[nodiscard]] kv_block_layout block_layout() const noexcept {
    return {shape_.num_layers,
            shape_.num_kv_heads,
            shape_.head_dim,
            shape_.block_size,
            static_cast<std::uint8_t>(dtype_of_v<T>),
            static_cast<std::uint8_t>(sizeof(T))};
  }
  /// Slots [0, len) of every layer of `block`, in the payload order
  /// [layer][k|v][kv_head][slot][head_dim] (slots past len, which may hold another request's
  /// leftovers, are never serialized).
  /// @throws error for a block outside the pool, len outside [1, block_size] or a wrong size
  void read_block(block_id block, std::int32_t len, std::span<std::byte> out) const {
    check_block_io("read_block", block, len, out.size());
    std::byte* p = out.data();
    const std::size_t run = static_cast<std::size_t>(len) * head_dim_elems() * sizeof(T);
    for (std::int32_t l = 0; l < shape_.num_layers; ++l)
      for (int w = 0; w < 2; ++w)
        for (std::int32_t h = 0; h < shape_.num_kv_heads; ++h, p += run)
          std::memcpy(p, tile(l, block, w, h), run);
  }
  /// The inverse of read_block.
  void write_block(block_id block, std::int32_t len, std::span<const std::byte> in) {
    check_block_io("write_block", block, len, in.size());
    const std::byte* p = in.data();
    const std::size_t run = static_cast<std::size_t>(len) * head_dim_elems() * sizeof(T);
    for (std::int32_t l = 0; l < shape_.num_layers; ++l)
      for (int w = 0; w < 2; ++w)
        for (std::int32_t h = 0; h < shape_.num_kv_heads; ++h, p += run)
          std::memcpy(static_cast<void*>(tile(l, block, w, h)), p, run);
  }

  /// View of one layer, for the attention kernels.
  [[nodiscard]] paged_kv_view<T> layer(std::int32_t l) noexcept {
    return {data_.data() + static_cast<std::size_t>(l) * shape_.layer_elems(), shape_.num_blocks,
            shape_.num_kv_heads, shape_.block_size, shape_.head_dim};
  }
  [[nodiscard]] paged_kv_view<const T> layer(std::int32_t l) const noexcept {
    return {data_.data() + static_cast<std::size_t>(l) * shape_.layer_elems(), shape_.num_blocks,
            shape_.num_kv_heads, shape_.block_size, shape_.head_dim};
  }

  /// Bytes held, for memory reports.
  [[nodiscard]] std::size_t bytes() const noexcept { return data_.size() * sizeof(T); }

 private:
  [[nodiscard]] std::size_t head_dim_elems() const noexcept {
    return static_cast<std::size_t>(shape_.head_dim);
  }
  void check_block_io(const char* what, block_id block, std::int32_t len, std::size_t n) const {
    if (block < 0 || block >= shape_.num_blocks || len <= 0 || len > shape_.block_size ||
        n != block_layout().payload_bytes(len))
      throw error(std::string("host_kv_storage::") + what + ": block " + std::to_string(block) +
                  ", " + std::to_string(len) + " slots, " + std::to_string(n) +
                  " bytes do not fit a pool of " + std::to_string(shape_.num_blocks) +
                  " blocks of " + std::to_string(shape_.block_size) + " slots (" +
                  std::to_string(block_layout().payload_bytes(std::max(len, 0))) + " bytes)");
  }
  [[nodiscard]] std::size_t offset(std::int32_t layer, block_id block, int which,
                                   std::int32_t head) const noexcept {
    return static_cast<std::size_t>(layer) * shape_.layer_elems() +
           static_cast<std::size_t>(block) * shape_.block_elems() +
           (static_cast<std::size_t>(which) * static_cast<std::size_t>(shape_.num_kv_heads) +
            static_cast<std::size_t>(head)) *
               shape_.tile();
  }

  kv_shape shape_;
  std::vector<T, detail::huge_page_allocator<T>> data_;
};

static_assert(kv_block_io<host_kv_storage<float>>, "host_kv_storage must model kv_block_io");

RELOKV_NAMESPACE_END
