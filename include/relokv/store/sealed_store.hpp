#pragma once
/// @file
/// Sealed blocks: an adapter over any kv_store that seals every block it puts with AES-256-GCM
/// (OpenSSL's libcrypto) under a key derived for the block's tenant, and opens every entry it
/// gets. The 128-byte header stays readable and is authenticated; the identity (the tokens)
/// and the K/V are encrypted and authenticated. Without the key nobody can read a span's
/// tokens or make an entry this reader accepts: an entry that does not open (another key, a
/// forged or edited one, an unsealed one) is a miss, counted in store_counters::open_failures.
///
/// Sealed entry: the block as block_format.hpp lays it out, with header byte 60 (seal) = 1 and
/// a random 96-bit nonce at 112, every byte after the header encrypted, and the 16-byte GCM
/// tag appended. The tenant key is HKDF-SHA256(master, salt "relokv.seal.v1", info: the
/// header's tenant salt), so one tenant's key opens no other tenant's block even under one
/// master key, and the header (key, fingerprint, extras, origin) cannot be moved to another
/// entry. Random nonces: about 2^32 blocks per tenant key before a repeat becomes plausible;
/// rotate the master key well before that.
///
/// Names: the store key is an unkeyed hash of the tokens (and their context), so anyone who can
/// list the store's names could test whether a guessed passage is cached. A sealed store files
/// each entry under a keyed name instead, the first 128 bits of HMAC-SHA256(name key, store
/// key), the name key HKDF-derived from the master key for naming alone ("name"); the header's
/// key field carries that name too (authenticated), and get() puts the store key back once the
/// entry has opened. The tenant's salt is inside the store key already, so two tenants' names
/// never meet. What stays visible: the cleartext header (sizes, layout shape, fingerprint,
/// extras, origin and principal, position), each entry's size and when it is read or written.
#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "relokv/concepts/kv_store.hpp"
#include "relokv/detail/buffer_pool.hpp"
#include "relokv/store/block_format.hpp"

RELOKV_NAMESPACE_BEGIN

inline constexpr std::size_t kSealTagBytes = 16;

/// A 256-bit master key for sealed blocks. Its bytes are wiped when it is destroyed and never
/// appear in a message.
class seal_key {
 public:
  static constexpr std::size_t kBytes = 32;

  explicit seal_key(std::span<const std::byte, kBytes> bytes) noexcept {
    std::memcpy(master_.data(), bytes.data(), kBytes);
  }
  seal_key(const seal_key& o) noexcept : master_(o.master_) {}
  seal_key& operator=(const seal_key& o) noexcept {
    master_ = o.master_;
    return *this;
  }
  ~seal_key() { OPENSSL_cleanse(master_.data(), master_.size()); }

  /// 64 hexadecimal digits (surrounding whitespace ignored).
  /// @throws error naming `what` (never the key) when `text` is anything else
  static seal_key from_hex(std::string_view text, const std::string& what) {
    while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    std::array<std::byte, kBytes> b{};
    bool ok = text.size() == 2 * kBytes;
    for (std::size_t i = 0; ok && i < kBytes; ++i) {
      const int hi = hex(text[2 * i]), lo = hex(text[2 * i + 1]);
      ok = hi >= 0 && lo >= 0;
      b[i] = static_cast<std::byte>((hi << 4) | lo);
    }
    if (!ok) {
      OPENSSL_cleanse(b.data(), b.size());
      throw error(what + ": a seal key is 64 hexadecimal digits (32 bytes)");
    }
    seal_key k(b);
    OPENSSL_cleanse(b.data(), b.size());
    return k;
  }
  /// The key in a file: 32 raw bytes or 64 hexadecimal digits. The file must be a regular file
  /// that only its owner can read or write (mode 0600 or 0400), as an SSH key must.
  /// @throws error (naming the file, never the key) when it is missing, unsafe or malformed
  static seal_key from_file(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw error("seal key file '" + path + "' cannot be opened");
    struct stat st {};
    std::array<char, 2 * kBytes + 64> buf{};
    ssize_t n = -1;
    const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (regular && (st.st_mode & 077) == 0 && st.st_size <= static_cast<off_t>(buf.size()))
      n = ::read(fd, buf.data(), buf.size());
    ::close(fd);
    if (!regular) throw error("seal key file '" + path + "' is not a regular file");
    if ((st.st_mode & 077) != 0)
      throw error("seal key file '" + path +
                  "' is readable or writable by group or others (chmod 600 it)");
    if (n < 0 || st.st_size > static_cast<off_t>(buf.size()))
      throw error("seal key file '" + path + "' cannot be read, or is too long for a key");
    struct wipe {
      std::array<char, 2 * kBytes + 64>& b;
      ~wipe() { OPENSSL_cleanse(b.data(), b.size()); }
    } w{buf};
    if (n == static_cast<ssize_t>(kBytes)) {
      std::array<std::byte, kBytes> raw{};
      std::memcpy(raw.data(), buf.data(), kBytes);
      seal_key k(raw);
      OPENSSL_cleanse(raw.data(), raw.size());
      // 32 bytes that are all hex digits would be ambiguous; raw wins, as its size says.
      return k;
    }
    return from_hex(std::string_view(buf.data(), static_cast<std::size_t>(n)),
                    "seal key file '" + path + "'");
  }
  /// The key in an environment variable, as 64 hexadecimal digits.
  /// @throws error (naming the variable, never the key) when it is unset or malformed
  static seal_key from_env(const std::string& name) {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) throw error("seal key variable " + name + " is not set");
    return from_hex(v, "seal key variable " + name);
  }

  /// The AES-256 key of one tenant: HKDF-SHA256(master, salt "relokv.seal.v1", info "tenant"
  /// and the salt's 8 bytes, little-endian).
  /// @throws error when libcrypto fails (it does not for valid input)
  [[nodiscard]] std::array<unsigned char, kBytes> tenant_key(std::uint64_t tenant_salt) const {
    std::array<unsigned char, kBytes> out{};
    derive("tenant", tenant_salt, out);
    return out;
  }
  /// The same derivation written straight into `out` (no copy of the key left behind), with
  /// the purpose `label` ("tenant": the AES key; "name": the key entries are named by,
  /// keyed_name). `out` is wiped when libcrypto fails.
  /// @throws error when libcrypto fails (it does not for valid input)
  void derive(std::string_view label, std::uint64_t tenant_salt,
              std::span<unsigned char, kBytes> out) const {
    static constexpr char kSalt[] = "relokv.seal.v1";
    unsigned char info[24] = {};
    const std::size_t ln = std::min<std::size_t>(label.size(), 16);
    std::memcpy(info, label.data(), ln);
    std::memcpy(info + ln, &tenant_salt, 8);
    EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
    EVP_KDF_CTX* ctx = kdf ? EVP_KDF_CTX_new(kdf) : nullptr;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY,
                                          const_cast<unsigned char*>(master_.data()), kBytes),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<char*>(kSalt),
                                          sizeof kSalt - 1),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, ln + 8),
        OSSL_PARAM_construct_end()};
    const bool ok = ctx != nullptr && EVP_KDF_derive(ctx, out.data(), out.size(), params) == 1;
    EVP_KDF_CTX_free(ctx);
    EVP_KDF_free(kdf);
    if (!ok) {
      OPENSSL_cleanse(out.data(), out.size());
      throw error("seal_key: libcrypto's HKDF failed");
    }
  }

 private:
  static bool is_space(char c) noexcept { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
  static int hex(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  std::array<unsigned char, kBytes> master_{};
};

/// Where a store's seal key comes from: a key file or an environment variable, never a URL or
/// a command line. Neither set: the store is not sealed.
struct seal_options {
  std::string key_file;  ///< a file holding the key (seal_key::from_file)
  std::string key_env;   ///< an environment variable holding it (seal_key::from_env)
  [[nodiscard]] bool enabled() const noexcept { return !key_file.empty() || !key_env.empty(); }
  /// @throws error when both or neither are set, or the key cannot be loaded
  [[nodiscard]] seal_key load() const {
    if (!key_file.empty() && !key_env.empty())
      throw error("seal_options: name a key file or a key variable, not both");
    if (!key_file.empty()) return seal_key::from_file(key_file);
    if (!key_env.empty()) return seal_key::from_env(key_env);
    throw error("seal_options: no key file or key variable named");
  }
};

/// A kv_store whose entries are sealed (see the file comment). Calls come from one thread at
/// a time, like any store's; write_behind takes two instances, one per thread.
template <class S>
requires kv_store<S>
class sealed_store {
 public:
  sealed_store(S inner, const seal_key& key)
      : inner_(std::move(inner)),
        key_(std::make_unique<seal_key>(key)),
        c_(std::make_unique<ctx>()),
        name_key_(std::make_unique<wiped_key>()) {
    key_->derive("name", 0, name_key_->bytes);
  }
  sealed_store(sealed_store&&) noexcept = default;
  sealed_store& operator=(sealed_store&&) noexcept = default;

  /// Gets and opens: an entry that does not open is empty (a miss) and counted. A store that
  /// hands entries over as they arrive (redis_store) has each opened then, while the rest of
  /// the batch is still on its way.
  store_status get(std::span<const store_key> keys, std::vector<store_blob>& out) {
    const std::span<const store_key> names = named(keys);
    const auto open_one = [this, keys, names](std::size_t i, const store_blob& raw) {
      return open_blob(raw, names[i], keys[i]);
    };
    if constexpr (requires { inner_.get(names, out, open_one); }) {
      return inner_.get(names, out, open_one);
    } else {
      const store_status st = inner_.get(names, raw_);
      out.assign(keys.size(), store_blob{});
      if (st != store_status::kOk) return st;
      for (std::size_t i = 0; i < keys.size() && i < raw_.size(); ++i)
        if (!raw_[i].empty()) out[i] = open_one(i, raw_[i]);
      raw_.clear();
      return st;
    }
  }
  /// The name an entry of store key `k` is filed under (see the file comment).
  [[nodiscard]] store_key keyed_name(const store_key& k) const {
    unsigned char in[16], mac[32];
    std::memcpy(in, &k.lo, 8);
    std::memcpy(in + 8, &k.hi, 8);
    unsigned int len = 0;
    if (HMAC(EVP_sha256(), name_key_->bytes.data(), static_cast<int>(name_key_->bytes.size()), in,
             sizeof in, mac, &len) == nullptr)
      throw error("sealed_store: libcrypto's HMAC-SHA256 failed");
    store_key n;
    std::memcpy(&n.lo, mac, 8);
    std::memcpy(&n.hi, mac + 8, 8);
    return n;
  }
  /// Seals and puts. A value that is no block of this format is not written (put_rejected).
  store_status put(std::span<const store_key> keys,
                   std::span<const std::span<const std::byte>> values) {
    const std::size_t n = std::min(keys.size(), values.size());
    if (bufs_.size() < n) bufs_.resize(n);
    keys_.clear();
    views_.clear();
    for (std::size_t i = 0; i < n; ++i) {
      const store_key name = keyed_name(keys[i]);
      if (!seal(values[i], bufs_[i], &name)) {
        ++seal_failures_;
        continue;
      }
      keys_.push_back(name);
      views_.emplace_back(bufs_[i].data(), bufs_[i].size());
    }
    if (keys_.empty()) return n == 0 ? store_status::kOk : store_status::kUnavailable;
    const store_status st = inner_.put(std::span<const store_key>(keys_),
                                       std::span<const std::span<const std::byte>>(views_));
    return st == store_status::kOk && keys_.size() == n ? store_status::kOk
                                                        : store_status::kUnavailable;
  }
  store_status contains(std::span<const store_key> keys, std::vector<std::uint8_t>& out) {
    return inner_.contains(named(keys), out);
  }
  store_status erase(std::span<const store_key> keys) { return inner_.erase(named(keys)); }
  /// The inner store's counts, plus the entries that did not open (open_failures) and the
  /// values that could not be sealed (put_rejected).
  [[nodiscard]] store_counters counters() const {
    store_counters c = inner_.counters();
    c.open_failures += open_failures_;
    c.put_rejected += seal_failures_;
    return c;
  }
  /// The bound on one opened block, forwarded with the tag's 16 bytes added.
  void limit_value_bytes(std::size_t n) {
    if constexpr (requires { inner_.limit_value_bytes(n); })
      inner_.limit_value_bytes(n + kSealTagBytes);
  }
  [[nodiscard]] S& inner() noexcept { return inner_; }
  [[nodiscard]] const S& inner() const noexcept { return inner_; }
  /// The inner store's servers, for a store spread over several (redis_cluster_store).
  [[nodiscard]] std::vector<store_node_stats> node_stats() const requires requires(const S& s) {
    s.node_stats();
  }
  { return inner_.node_stats(); }

  /// Seals one encoded block into `out` (resized). False, writing nothing useful, when `in`
  /// is no unsealed block of this format version (seal mark and nonce zero, its size the one
  /// its header states) or libcrypto fails. `name`: the keyed name the header's key field
  /// carries instead of the store key (put() passes keyed_name(key)).
  bool seal(std::span<const std::byte> in, std::vector<std::byte>& out,
            const store_key* name = nullptr) {
    const std::size_t n = in.size();
    if (n < kBlockHeaderBytes || n > static_cast<std::size_t>(INT_MAX) ||
        detail::get_le<std::uint32_t>(in.data()) != kBlockMagic ||
        detail::get_le<std::uint16_t>(in.data() + 4) != kBlockFormatVersion ||
        detail::get_le<std::uint8_t>(in.data() + kBlockSealOffset) != 0 ||
        detail::get_le<std::uint64_t>(in.data() + kBlockTotalOffset) != n ||
        std::any_of(in.begin() + kBlockNonceOffset,
                    in.begin() + kBlockNonceOffset + kBlockNonceBytes,
                    [](std::byte c) { return c != std::byte{0}; }))
      return false;
    out.resize(n + kSealTagBytes);
    std::byte* o = out.data();
    std::memcpy(o, in.data(), kBlockHeaderBytes);
    o[kBlockSealOffset] = std::byte{1};
    if (name != nullptr) {
      std::memcpy(o + kBlockKeyOffset, &name->lo, 8);
      std::memcpy(o + kBlockKeyOffset + 8, &name->hi, 8);
    }
    if (RAND_bytes(reinterpret_cast<unsigned char*>(o + kBlockNonceOffset), kBlockNonceBytes) != 1)
      return false;
    const auto* key = tenant_key(detail::get_le<std::uint64_t>(o + kBlockTenantSaltOffset));
    EVP_CIPHER_CTX* x = c_->cipher_ctx;
    int len = 0;
    const auto* iv = reinterpret_cast<const unsigned char*>(o + kBlockNonceOffset);
    return key != nullptr && EVP_EncryptInit_ex2(x, c_->cipher, key, iv, nullptr) == 1 &&
           EVP_EncryptUpdate(x, nullptr, &len, reinterpret_cast<const unsigned char*>(o),
                             static_cast<int>(kBlockHeaderBytes)) == 1 &&
           EVP_EncryptUpdate(x, reinterpret_cast<unsigned char*>(o + kBlockHeaderBytes), &len,
                             reinterpret_cast<const unsigned char*>(in.data() + kBlockHeaderBytes),
                             static_cast<int>(n - kBlockHeaderBytes)) == 1 &&
           EVP_EncryptFinal_ex(x, reinterpret_cast<unsigned char*>(o + n), &len) == 1 &&
           EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, static_cast<int>(kSealTagBytes), o + n) ==
               1;
  }
  /// Opens one sealed entry into `out` (resized): the block as it was before sealing. False
  /// when it is not a sealed block of this format, or its tag does not verify under the key
  /// of the tenant its header names (another key, or any byte changed).
  bool open(std::span<const std::byte> in, std::vector<std::byte>& out) {
    out.clear();
    if (!sealed_size(in)) return false;
    out.resize(in.size() - kSealTagBytes);
    if (open_into(in, out.data())) return true;
    OPENSSL_cleanse(out.data(), out.size());  // what did not authenticate is never handed on
    out.clear();
    return false;
  }

 private:
  /// The keyed names of `keys`, in a buffer of this store's.
  std::span<const store_key> named(std::span<const store_key> keys) {
    names_.clear();
    for (const store_key& k : keys) names_.push_back(keyed_name(k));
    return names_;
  }
  /// One fetched entry opened into a pooled buffer, or empty (counted) when it does not open:
  /// its header must name `name`, and the opened block gets `key` back in that field.
  store_blob open_blob(const store_blob& raw, const store_key& name, const store_key& key) {
    const std::span<const std::byte> in = raw.bytes();
    if (!sealed_size(in) || detail::get_le<std::uint64_t>(in.data() + kBlockKeyOffset) != name.lo ||
        detail::get_le<std::uint64_t>(in.data() + kBlockKeyOffset + 8) != name.hi) {
      ++open_failures_;
      return {};
    }
    auto buf = pool_.take(in.size() - kSealTagBytes);  // wiped when let go (pool_ wipes)
    if (!open_into(in, buf->bytes.get())) {
      ++open_failures_;
      return {};  // the unauthenticated bytes are wiped as buf goes
    }
    std::memcpy(buf->bytes.get() + kBlockKeyOffset, &key.lo, 8);
    std::memcpy(buf->bytes.get() + kBlockKeyOffset + 8, &key.hi, 8);
    const std::span<const std::byte> view(buf->bytes.get(), in.size() - kSealTagBytes);
    return store_blob(std::move(buf), view);
  }
  /// Whether `in` has the shape of a sealed entry of this format: magic, version, seal mark,
  /// and the size its header states plus the tag.
  static bool sealed_size(std::span<const std::byte> in) noexcept {
    const std::size_t n = in.size();
    const std::byte* p = in.data();
    return n >= kBlockHeaderBytes + kSealTagBytes && n <= static_cast<std::size_t>(INT_MAX) &&
           detail::get_le<std::uint32_t>(p) == kBlockMagic &&
           detail::get_le<std::uint16_t>(p + 4) == kBlockFormatVersion &&
           detail::get_le<std::uint8_t>(p + kBlockSealOffset) == 1 &&
           detail::get_le<std::uint64_t>(p + kBlockTotalOffset) == n - kSealTagBytes;
  }
  /// Opens a sealed entry of sealed_size() into o[0, size - tag); false when its tag does not
  /// verify (o then holds unauthenticated bytes that the caller drops).
  bool open_into(std::span<const std::byte> in, std::byte* o) {
    const std::size_t n = in.size();
    const std::byte* p = in.data();
    const std::size_t plain = n - kSealTagBytes;
    const auto* key = tenant_key(detail::get_le<std::uint64_t>(p + kBlockTenantSaltOffset));
    EVP_CIPHER_CTX* x = c_->cipher_ctx;
    int len = 0;
    unsigned char tag[kSealTagBytes];
    std::memcpy(tag, p + plain, kSealTagBytes);
    const auto* iv = reinterpret_cast<const unsigned char*>(p + kBlockNonceOffset);
    const bool ok =
        key != nullptr && EVP_DecryptInit_ex2(x, c_->cipher, key, iv, nullptr) == 1 &&
        EVP_DecryptUpdate(x, nullptr, &len, reinterpret_cast<const unsigned char*>(p),
                          static_cast<int>(kBlockHeaderBytes)) == 1 &&
        EVP_DecryptUpdate(x, reinterpret_cast<unsigned char*>(o + kBlockHeaderBytes), &len,
                          reinterpret_cast<const unsigned char*>(p + kBlockHeaderBytes),
                          static_cast<int>(plain - kBlockHeaderBytes)) == 1 &&
        EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_SET_TAG, static_cast<int>(kSealTagBytes), tag) == 1 &&
        EVP_DecryptFinal_ex(x, reinterpret_cast<unsigned char*>(o + plain), &len) == 1;
    if (!ok) return false;
    // The block as it was encoded: unsealed mark, no nonce (its checksum covers both).
    std::memcpy(o, p, kBlockHeaderBytes);
    o[kBlockSealOffset] = std::byte{0};
    std::memset(o + kBlockNonceOffset, 0, kBlockNonceBytes);
    return true;
  }

  /// libcrypto's cipher and context, fetched once per store.
  struct ctx {
    EVP_CIPHER* cipher = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
    EVP_CIPHER_CTX* cipher_ctx = EVP_CIPHER_CTX_new();
    ctx() {
      if (cipher == nullptr || cipher_ctx == nullptr) {
        EVP_CIPHER_CTX_free(cipher_ctx);
        EVP_CIPHER_free(cipher);
        throw error("sealed_store: libcrypto has no AES-256-GCM");
      }
    }
    ~ctx() {
      EVP_CIPHER_CTX_free(cipher_ctx);
      EVP_CIPHER_free(cipher);
    }
    ctx(const ctx&) = delete;
    ctx& operator=(const ctx&) = delete;
  };
  /// The tenant's key, derived once and kept (a bounded number of tenants: a store that
  /// names many salts only makes the cache start over).
  const unsigned char* tenant_key(std::uint64_t salt) {
    auto it = keys_by_tenant_.find(salt);
    if (it == keys_by_tenant_.end()) {
      if (keys_by_tenant_.size() >= 1024) wipe_keys();
      // Derived in place, in the map's own storage: no temporary copy of the key to wipe.
      it = keys_by_tenant_.try_emplace(salt).first;
      try {
        key_->derive("tenant", salt, it->second);
      } catch (const error&) {
        keys_by_tenant_.erase(it);  // derive() wiped it
        return nullptr;
      }
    }
    return it->second.data();
  }
  void wipe_keys() noexcept {
    for (auto& [salt, k] : keys_by_tenant_) OPENSSL_cleanse(k.data(), k.size());
    keys_by_tenant_.clear();
  }
  struct wiped_map : std::unordered_map<std::uint64_t, std::array<unsigned char, 32>> {
    wiped_map() = default;
    wiped_map(wiped_map&&) noexcept = default;
    wiped_map& operator=(wiped_map&&) noexcept = default;
    ~wiped_map() {
      for (auto& [salt, k] : *this) OPENSSL_cleanse(k.data(), k.size());
    }
  };

  /// The naming key, wiped when the store goes.
  struct wiped_key {
    std::array<unsigned char, seal_key::kBytes> bytes{};
    wiped_key() = default;
    wiped_key(const wiped_key&) = delete;
    wiped_key& operator=(const wiped_key&) = delete;
    ~wiped_key() { OPENSSL_cleanse(bytes.data(), bytes.size()); }
  };

  S inner_;
  std::unique_ptr<seal_key> key_;
  std::unique_ptr<ctx> c_;
  std::unique_ptr<wiped_key> name_key_;
  std::vector<store_key> names_;
  wiped_map keys_by_tenant_;
  std::vector<store_blob> raw_;
  detail::buffer_pool pool_{/*wipe=*/true};
  std::vector<std::vector<std::byte>> bufs_;
  std::vector<store_key> keys_;
  std::vector<std::span<const std::byte>> views_;
  std::int64_t open_failures_ = 0, seal_failures_ = 0;
};

RELOKV_NAMESPACE_END
