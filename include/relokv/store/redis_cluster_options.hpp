#pragma once
/// @file
/// What a Redis Cluster client needs before it connects: the hash slot of a key (CRC16 and
/// hash tags, as the Redis Cluster specification defines them) and redis_cluster_store's
/// options with their URL. Needs hiredis (through the endpoint type); included by
/// redis_cluster_store.hpp.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "relokv/store/detail/redis_link.hpp"
#include "relokv/store/store_url.hpp"

RELOKV_NAMESPACE_BEGIN

/// The number of hash slots of a Redis Cluster.
inline constexpr int kRedisClusterSlots = 16384;

/// CRC16 as the Redis Cluster specification defines it (XMODEM: polynomial 0x1021, initial
/// value 0): CRC16("123456789") is 0x31C3.
[[nodiscard]] constexpr std::uint16_t redis_crc16(std::string_view s) noexcept {
  std::uint16_t crc = 0;
  for (const char ch : s) {
    crc ^= static_cast<std::uint16_t>(static_cast<unsigned char>(ch) << 8);
    for (int b = 0; b < 8; ++b)
      crc = (crc & 0x8000) != 0 ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<std::uint16_t>(crc << 1);
  }
  return crc;
}

/// The hash slot of a key: CRC16 of the key mod 16384, or of its hash tag (what lies between
/// its first '{' and the first '}' after it, when that is not empty) so that keys sharing a
/// tag share a slot.
[[nodiscard]] constexpr int redis_cluster_slot(std::string_view key) noexcept {
  if (const auto open = key.find('{'); open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return redis_crc16(key) & (kRedisClusterSlots - 1);
}

struct redis_cluster_options {
  /// Nodes to learn the slot map from (any of the cluster's nodes will do; more survive one
  /// being down at start-up).
  std::vector<detail::redis_endpoint> seeds;
  /// Redis 6+ ACL user and password, on every node (the cluster does not propagate ACLs:
  /// each node needs the user). Never printed.
  std::string user, password;
  /// Entries are <prefix><32 hex digits>, each in its own key's slot (a prefix may carry a
  /// hash tag, `{tenant}:`, to keep a tenant on one node).
  std::string key_prefix = "relokv:";
  std::chrono::milliseconds connect_timeout{200};
  std::chrono::milliseconds command_timeout{1000};  ///< a call's deadline (all nodes, redirects)
  std::chrono::milliseconds retry_interval{250};    ///< between attempts on a node; map refreshes
  std::size_t max_value_bytes = std::size_t{256} << 20;
  int max_redirects = 5;  ///< per key and call; past it the key is a miss (redirect_limit)
  /// Gets go to a replica of the slot's master (READONLY), spreading reads; off by default. A
  /// replica may lag its master's writes (asynchronous replication): a block written a moment
  /// ago may be a miss there, never a wrong block (entries are whole and content-addressed).
  bool read_from_replicas = false;

  /// `redis-cluster://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...][?prefix=P][&replicas=1]`:
  /// HOST a name, an IPv4 address or `[IPv6]`; USER and PASSWORD as in redis:// (percent-
  /// encoded; `USER@` takes the password from RELOKV_REDIS_PASSWORD).
  /// @throws error naming what is wrong (with the URL redacted)
  [[nodiscard]] static redis_cluster_options from_url(const std::string& url) {
    redis_cluster_options o;
    const auto bad = [&url](const std::string& why) {
      return error("redis_cluster_store: bad URL '" + redact_url(url) + "': " + why +
                   " (expected redis-cluster://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]"
                   "[?prefix=P][&replicas=1])");
    };
    constexpr std::string_view scheme = "redis-cluster://";
    if (url.rfind(scheme, 0) != 0) throw bad("not a redis-cluster:// URL");
    std::string s = url.substr(scheme.size()), query;
    detail::url_credentials(s, bad, o.user, o.password);
    if (const auto q = s.find('?'); q != std::string::npos) {
      query = s.substr(q + 1);
      s.resize(q);
    }
    for (std::size_t i = 0; !query.empty() && i <= query.size();) {
      const auto amp = std::min(query.find('&', i), query.size());
      const std::string kv = query.substr(i, amp - i);
      const auto eq = kv.find('=');
      const std::string k = kv.substr(0, eq), v = eq == std::string::npos ? "" : kv.substr(eq + 1);
      if (k == "prefix" && !v.empty())
        o.key_prefix = detail::url_decode(v, bad);
      else if (k == "replicas" && (v == "0" || v == "1"))
        o.read_from_replicas = v == "1";
      else
        throw bad("unknown or empty query parameter '" + k + "'");
      i = amp + 1;
    }
    for (std::size_t i = 0; i <= s.size();) {
      const auto comma = std::min(s.find(',', i), s.size());
      o.seeds.push_back(parse_host_port(s.substr(i, comma - i), bad));
      i = comma + 1;
    }
    return o;
  }

  /// The options as a URL without the password, for reports.
  [[nodiscard]] std::string redacted() const {
    std::string u = "redis-cluster://";
    if (!user.empty() || !password.empty()) u += user + (password.empty() ? "@" : ":***@");
    for (std::size_t i = 0; i < seeds.size(); ++i) u += (i ? "," : "") + seeds[i].name();
    return u;
  }

 private:
  template <class Bad>
  static detail::redis_endpoint parse_host_port(const std::string& s, const Bad& bad) {
    detail::redis_endpoint e;
    if (s.empty()) throw bad("an empty node (HOST:PORT expected between the commas)");
    if (s[0] == '[') {
      const auto close = s.find(']');
      if (close == std::string::npos) throw bad("unclosed '[' in an IPv6 address");
      e.host = s.substr(1, close - 1);
      if (e.host.empty() ||
          e.host.find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos)
        throw bad("not an IPv6 address between the brackets");
      if (close + 1 >= s.size() || s[close + 1] != ':') throw bad("a node needs its port");
      e.port = detail::url_port(s.substr(close + 2), bad);
      return e;
    }
    const auto colon = s.rfind(':');
    if (colon == std::string::npos) throw bad("node '" + s + "' needs its port (HOST:PORT)");
    if (s.find(':') != colon) throw bad("an IPv6 address must be written in brackets");
    e.host = s.substr(0, colon);
    e.port = detail::url_port(s.substr(colon + 1), bad);
    if (e.host.empty() || e.host.find_first_of(" @[]/") != std::string::npos)
      throw bad("not a host name");
    return e;
  }
};

RELOKV_NAMESPACE_END
