#pragma once
// relokv_server's API keys and tenants. Keys come from a file (--api-key-file: one KEY:TENANT a
// line, the file readable by its owner only, as a store's seal key must be), from the
// environment (RELOKV_API_KEYS: KEY:TENANT entries separated by commas), or from --api-key
// (visible to every user of the machine in `ps`: for tests). A presented key is compared with
// every key in constant time (a digest of each, compared whole), so the time an answer takes
// says nothing about how much of a key was right. The admin key (--admin-key-file) reads
// /metrics, which counts every tenant's traffic; no tenant key does.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <relokv/hash/block_keys.hpp>

namespace relokv_server {

struct tenant {
  std::string name;
  relokv::extra_keys keys;      ///< the tenant salt in every cache key (unless shared spans)
  std::uint64_t principal = 0;  ///< provenance: who computed a block
};

class key_ring {
 public:
  /// `entries`: KEY:TENANT strings. `share_spans`: tenants' cache keys carry no salt.
  /// @throws std::runtime_error for a malformed entry (named by its position, never its key)
  ///         or a key given twice
  void add(const std::vector<std::string>& entries, const std::string& from, bool share_spans);
  /// The entries of a key file: owner-only (mode 0600 or 0400), a regular file, one KEY:TENANT
  /// a line ('#' comments and blank lines skipped). @throws std::runtime_error saying why
  static std::vector<std::string> read_file(const std::string& path);
  /// One key alone (the admin key's file holds just the key).
  static std::string read_single(const std::string& path);
  /// The entries of an environment variable (comma-separated); empty when unset.
  static std::vector<std::string> from_env(const char* name);

  /// Whether any key was given (without keys no key is asked).
  [[nodiscard]] bool empty() const noexcept { return keys_.empty(); }
  /// The tenant of `Authorization: Bearer KEY`, or nullptr; constant time in the key.
  [[nodiscard]] const tenant* find(const std::string& authorization) const;
  /// Sets the admin key (empty: none). @throws std::runtime_error for one that is a tenant's
  void set_admin(const std::string& key);
  [[nodiscard]] bool has_admin() const noexcept { return admin_.has_value(); }
  /// Whether `authorization` carries the admin key; constant time.
  [[nodiscard]] bool admin(const std::string& authorization) const;

 private:
  using digest = std::array<unsigned char, 32>;
  static digest hash(const std::string& key);
  static std::optional<std::string> bearer(const std::string& authorization);
  std::vector<std::pair<digest, tenant>> keys_;
  std::optional<digest> admin_;
};

}  // namespace relokv_server
