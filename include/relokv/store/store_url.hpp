#pragma once
/// @file
/// Store URLs in reports: redact_url hides the password a URL may carry.
#include <cstddef>
#include <cstdlib>
#include <string>

#include "relokv/config.hpp"

RELOKV_NAMESPACE_BEGIN

/// `url` with the password of its user information (`scheme://user:PASSWORD@...`) replaced by
/// `***`: what reports, logs and error messages show of a store URL.
[[nodiscard]] inline std::string redact_url(const std::string& url) {
  const auto scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const auto start = scheme + 3;
  // The last '@': a password may hold '/', '?' or '@' unencoded, and hiding too much is safer
  // than showing any of it.
  const auto at = url.rfind('@');
  if (at == std::string::npos || at < start) return url;
  const auto colon = url.find(':', start);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

namespace detail {

/// A port number in [1, 65535], or bad(reason) thrown.
template <class Bad>
int url_port(const std::string& digits, const Bad& bad) {
  if (digits.empty() || digits.size() > 5 ||
      digits.find_first_not_of("0123456789") != std::string::npos || std::stoi(digits) == 0 ||
      std::stoi(digits) > 65535)
    throw bad("port is not in [1, 65535]");
  return std::stoi(digits);
}

/// Percent-decoding (RFC 3986) of a URL component, or bad(reason) thrown.
template <class Bad>
std::string url_decode(const std::string& in, const Bad& bad) {
  std::string out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out += in[i];
      continue;
    }
    const auto hex = [](char c) {
      return c >= '0' && c <= '9'   ? c - '0'
             : c >= 'a' && c <= 'f' ? c - 'a' + 10
             : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                    : -1;
    };
    if (i + 2 >= in.size() || hex(in[i + 1]) < 0 || hex(in[i + 2]) < 0)
      throw bad("a '%' not followed by two hex digits");
    out += static_cast<char>(hex(in[i + 1]) * 16 + hex(in[i + 2]));
    i += 2;
  }
  return out;
}

/// Splits the user information off a Redis URL's rest `s` (after the scheme), up to its last
/// '@' (a password may hold '/', '?' or '@'): USER[:PASSWORD], percent-decoded, into `user`
/// and `password`. USER@HOST takes the password from the environment variable
/// RELOKV_REDIS_PASSWORD, so that it need not be on a command line (where ps shows it); user
/// information with no password either way is bad(reason).
template <class Bad>
void url_credentials(std::string& s, const Bad& bad, std::string& user, std::string& password) {
  const auto at = s.rfind('@');
  if (at == std::string::npos) return;
  const std::string info = s.substr(0, at);
  s = s.substr(at + 1);
  const auto colon = info.find(':');
  user = url_decode(info.substr(0, colon), bad);
  if (colon != std::string::npos) password = url_decode(info.substr(colon + 1), bad);
  if (password.empty())
    if (const char* env = std::getenv("RELOKV_REDIS_PASSWORD"); env != nullptr) password = env;
  if (password.empty())
    throw bad("user information without a password (in the URL or RELOKV_REDIS_PASSWORD)");
}

}  // namespace detail

RELOKV_NAMESPACE_END
