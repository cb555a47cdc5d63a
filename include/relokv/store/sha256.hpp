#pragma once
/// @file
/// SHA-256 through OpenSSL's libcrypto (EVP): the collision-resistant digest that bounds a
/// stored block's identity (block_format.hpp). Incremental, with a snapshot that leaves the
/// running state untouched, so one pass over a request gives the digest before every block.
#include <openssl/evp.h>

#include <array>
#include <cstddef>
#include <span>
#include <utility>

#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

using sha256_digest = std::array<std::byte, 32>;

/// A running SHA-256. Movable, not copyable (it owns an EVP context).
class sha256 {
 public:
  /// @throws error when libcrypto cannot start a context (out of memory)
  sha256() : ctx_(EVP_MD_CTX_new()) {
    if (ctx_ == nullptr) throw error("sha256: libcrypto could not allocate a digest context");
    reset();
  }
  ~sha256() { EVP_MD_CTX_free(ctx_); }
  sha256(sha256&& o) noexcept : ctx_(std::exchange(o.ctx_, nullptr)) {}
  sha256& operator=(sha256&& o) noexcept {
    std::swap(ctx_, o.ctx_);
    return *this;
  }
  sha256(const sha256&) = delete;
  sha256& operator=(const sha256&) = delete;

  /// Starts over, as a new context.
  void reset() {
    if (EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1)
      throw error("sha256: libcrypto refused to start SHA-256");
  }
  void update(const void* p, std::size_t n) {
    if (n != 0 && EVP_DigestUpdate(ctx_, p, n) != 1)
      throw error("sha256: libcrypto refused an update");
  }
  template <class T>
  void update(std::span<const T> s) {
    update(s.data(), s.size_bytes());
  }
  template <class T>
  void update_value(const T& v) {
    update(&v, sizeof v);
  }
  /// The digest of everything absorbed so far, computed in `scratch`; this context goes on.
  [[nodiscard]] sha256_digest peek(sha256& scratch) const {
    if (EVP_MD_CTX_copy_ex(scratch.ctx_, ctx_) != 1)
      throw error("sha256: libcrypto could not copy a digest context");
    return scratch.finish();
  }
  /// The digest; the context must be reset() before it is used again.
  [[nodiscard]] sha256_digest finish() {
    sha256_digest d{};
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx_, reinterpret_cast<unsigned char*>(d.data()), &n) != 1 ||
        n != d.size())
      throw error("sha256: libcrypto could not finish a digest");
    return d;
  }

 private:
  EVP_MD_CTX* ctx_;
};

RELOKV_NAMESPACE_END
