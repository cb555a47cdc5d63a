// relokv_server's API keys (auth.hpp).
#include "auth.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <relokv/hash/xxh3.hpp>

namespace relokv_server {

namespace {

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  const auto e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

/// A key file's text: a regular file only its owner can read (0600 or 0400), at most 1 MiB.
std::string read_private(const std::string& path, const char* what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) throw std::runtime_error(std::string(what) + " '" + path + "' cannot be opened");
  struct ::stat st {};
  const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (!ok || (st.st_mode & 077) != 0 || st.st_size > (1 << 20)) {
    ::close(fd);
    throw std::runtime_error(std::string(what) + " '" + path + "' " +
                             (!ok                      ? "is not a regular file"
                              : st.st_size > (1 << 20) ? "is larger than 1 MiB"
                                                       : "is readable by others: chmod 600 it"));
  }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  return text;
}

}  // namespace

key_ring::digest key_ring::hash(const std::string& key) {
  digest d{};
  unsigned int n = 0;
  if (EVP_Digest(key.data(), key.size(), d.data(), &n, EVP_sha256(), nullptr) != 1 || n != 32)
    throw std::runtime_error("libcrypto refused SHA-256");
  return d;
}

std::optional<std::string> key_ring::bearer(const std::string& authorization) {
  constexpr std::string_view kScheme = "Bearer ";
  if (authorization.size() <= kScheme.size() ||
      authorization.compare(0, kScheme.size(), kScheme) != 0)
    return std::nullopt;
  return authorization.substr(kScheme.size());
}

void key_ring::add(const std::vector<std::string>& entries, const std::string& from,
                   bool share_spans) {
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::string& k = entries[i];
    const auto colon = k.find(':');
    if (colon == 0 || colon == std::string::npos || colon + 1 == k.size())
      throw std::runtime_error(from + ": entry " + std::to_string(i + 1) +
                               " is not KEY:TENANT (the key is not shown)");
    tenant t;
    t.name = k.substr(colon + 1);
    const std::uint64_t h = XXH3_64bits(t.name.data(), t.name.size()) | 1u;
    t.principal = h;
    if (!share_spans) t.keys.tenant_salt = h;
    const digest d = hash(k.substr(0, colon));
    for (const auto& [other, _] : keys_)
      if (CRYPTO_memcmp(other.data(), d.data(), d.size()) == 0)
        throw std::runtime_error(from + ": entry " + std::to_string(i + 1) +
                                 " repeats a key given before");
    keys_.emplace_back(d, std::move(t));
  }
}

std::vector<std::string> key_ring::read_file(const std::string& path) {
  std::vector<std::string> out;
  const std::string text = read_private(path, "--api-key-file");
  std::size_t at = 0;
  while (at <= text.size()) {
    auto nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = trim(text.substr(at, nl - at));
    if (!line.empty() && line[0] != '#') out.push_back(line);
    at = nl + 1;
  }
  return out;
}

std::string key_ring::read_single(const std::string& path) {
  const std::string k = trim(read_private(path, "--admin-key-file"));
  if (k.empty()) throw std::runtime_error("--admin-key-file '" + path + "' holds no key");
  return k;
}

std::vector<std::string> key_ring::from_env(const char* name) {
  std::vector<std::string> out;
  const char* v = std::getenv(name);
  if (v == nullptr) return out;
  const std::string s(v);
  std::size_t at = 0;
  while (at <= s.size()) {
    auto comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    const std::string e = trim(s.substr(at, comma - at));
    if (!e.empty()) out.push_back(e);
    at = comma + 1;
  }
  return out;
}

const tenant* key_ring::find(const std::string& authorization) const {
  const auto key = bearer(authorization);
  const digest d = hash(key ? *key : std::string());
  // Every key is compared, whole, whichever matches: no early exit.
  const tenant* found = nullptr;
  for (const auto& [k, t] : keys_) {
    const bool same = CRYPTO_memcmp(k.data(), d.data(), d.size()) == 0;
    found = same && key ? &t : found;
  }
  return found;
}

void key_ring::set_admin(const std::string& key) {
  if (key.empty()) {
    admin_.reset();
    return;
  }
  const digest d = hash(key);
  for (const auto& [k, _] : keys_)
    if (CRYPTO_memcmp(k.data(), d.data(), d.size()) == 0)
      throw std::runtime_error("the admin key is also a tenant's key");
  admin_ = d;
}

bool key_ring::admin(const std::string& authorization) const {
  const auto key = bearer(authorization);
  if (!admin_ || !key) return false;
  const digest d = hash(*key);
  return CRYPTO_memcmp(admin_->data(), d.data(), d.size()) == 0;
}

}  // namespace relokv_server
