#pragma once
// Baseline: a SHA-256 chained block hash as vLLM recommends for multi-tenant prefix caching
// (hash(parent digest, block tokens, extra keys)), with OpenSSL's fastest reusable-context path.
#include <openssl/evp.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include <relokv/layout/request_layout.hpp>

namespace relokv_bench {

class sha256_chain {
 public:
  sha256_chain() : md_(EVP_MD_fetch(nullptr, "SHA256", nullptr)), ctx_(EVP_MD_CTX_new()) {
    if (!md_ || !ctx_) throw std::runtime_error("OpenSSL SHA256 unavailable");
  }
  ~sha256_chain() {
    EVP_MD_CTX_free(ctx_);
    EVP_MD_free(md_);
  }
  sha256_chain(const sha256_chain&) = delete;
  sha256_chain& operator=(const sha256_chain&) = delete;

  /// One digest per block, chained; returns the last.
  std::array<unsigned char, 32> run(const relokv::request_layout& l) {
    std::array<unsigned char, 32> parent{};
    const std::uint64_t extras[3] = {1, 2, 3};
    for (std::int32_t b = 0; b < l.num_blocks(); ++b) {
      const auto t = l.block_tokens(b);
      unsigned int n = 0;
      EVP_DigestInit_ex2(ctx_, md_, nullptr);
      EVP_DigestUpdate(ctx_, parent.data(), parent.size());
      EVP_DigestUpdate(ctx_, t.data(), t.size_bytes());
      EVP_DigestUpdate(ctx_, extras, sizeof extras);
      EVP_DigestFinal_ex(ctx_, parent.data(), &n);
    }
    return parent;
  }

 private:
  EVP_MD* md_;
  EVP_MD_CTX* ctx_;
};

}  // namespace relokv_bench
