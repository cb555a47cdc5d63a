#pragma once
/// @file
/// Buffers that stores read or open entries into, handed out inside store_blobs and reused
/// once every blob that held one is gone: a get writes into memory that is already mapped and
/// warm, instead of faulting in fresh pages for every block (a 720 KiB block is 180 page
/// faults and a munmap when it is allocated per get).
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "relokv/config.hpp"

RELOKV_NAMESPACE_BEGIN
namespace detail {

/// A pool per store object: a copy of the store starts with its own (copies may serve other
/// threads, e.g. write_behind's worker). Not synchronized: one thread calls at a time.
class buffer_pool {
 public:
  struct buffer {
    std::unique_ptr<std::byte[]> bytes;
    std::size_t capacity = 0;
  };

  buffer_pool() = default;
  buffer_pool(const buffer_pool&) noexcept {}
  buffer_pool& operator=(const buffer_pool&) noexcept {
    free_.clear();
    return *this;
  }
  buffer_pool(buffer_pool&&) noexcept = default;
  buffer_pool& operator=(buffer_pool&&) noexcept = default;

  /// A buffer of at least n bytes that no blob holds (its bytes are not zeroed). Up to
  /// `keep` bytes of buffers are kept for reuse; past that, new ones are the caller's alone.
  std::shared_ptr<buffer> take(std::size_t n, std::size_t keep = std::size_t{512} << 20) {
    std::shared_ptr<buffer>* spare = nullptr;
    std::size_t held = 0;
    for (auto& b : free_) {
      held += b->capacity;
      if (b.use_count() == 1 && b->capacity >= n &&
          (spare == nullptr || b->capacity < (*spare)->capacity))
        spare = &b;
    }
    if (spare != nullptr) return *spare;
    auto b = std::make_shared<buffer>();
    b->bytes = std::make_unique_for_overwrite<std::byte[]>(n);  // written over at once
    b->capacity = n;
    if (held + n <= keep) free_.push_back(b);
    return b;
  }

 private:
  std::vector<std::shared_ptr<buffer>> free_;
};

}  // namespace detail
RELOKV_NAMESPACE_END
