#pragma once
/// @file
/// Store URLs in reports: redact_url hides the password a URL may carry.
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

RELOKV_NAMESPACE_END
