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

  /// `wipe`: every buffer is zeroed (OPENSSL_cleanse-style, not elided) when the last blob
  /// that held it lets it go, so plaintext never waits in the pool (sealed_store's opened
  /// blocks).
  explicit buffer_pool(bool wipe = false) noexcept : wipe_(wipe) {}
  buffer_pool(const buffer_pool& o) noexcept : wipe_(o.wipe_) {}
  buffer_pool& operator=(const buffer_pool& o) noexcept {
    free_.clear();
    wipe_ = o.wipe_;
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
    std::shared_ptr<buffer> b;
    if (spare != nullptr) {
      b = *spare;
    } else {
      b = std::make_shared<buffer>();
      b->bytes = std::make_unique_for_overwrite<std::byte[]>(n);  // written over at once
      b->capacity = n;
      if (held + n <= keep) free_.push_back(b);
    }
    if (!wipe_) return b;
    // The caller's handle: when its last copy goes, the bytes are wiped, then the pool's
    // reference (held by the deleter) is dropped.
    buffer* raw = b.get();
    return std::shared_ptr<buffer>(raw, [hold = std::move(b)](buffer* p) noexcept {
      wipe_bytes(p->bytes.get(), p->capacity);
    });
  }

  /// Zeroes n bytes in a way the compiler may not drop as a dead store.
  static void wipe_bytes(std::byte* p, std::size_t n) noexcept {
    volatile std::byte* v = p;
    for (std::size_t i = 0; i < n; ++i) v[i] = std::byte{0};
  }

 private:
  std::vector<std::shared_ptr<buffer>> free_;
  bool wipe_ = false;
};

}  // namespace detail
RELOKV_NAMESPACE_END
