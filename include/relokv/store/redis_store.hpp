#pragma once
/// @file
/// A store on a Redis server through hiredis (Debian: libhiredis-dev; link -lhiredis, or
/// `find_package(relokv COMPONENTS redis)` and relokv::redis). Nothing else in relokv includes
/// this header: only an engine that asks for Redis needs hiredis.
///
/// One round trip per call: get is a pipeline of GETs, put a pipeline of SETs. Every call is
/// bounded by the command timeout; a server that is down, slow or gone mid-reply makes the call
/// answer kUnavailable (the request computes instead), and the next call after the retry interval
/// reconnects. A server that refuses a write (maxmemory with noeviction) counts put_rejected.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <hiredis/hiredis.h>

#include "relokv/concepts/kv_store.hpp"
#include "relokv/store/detail/redis_link.hpp"
#include "relokv/store/store_url.hpp"

RELOKV_NAMESPACE_BEGIN

struct redis_store_options {
  std::string host = "127.0.0.1";  ///< a name, an IPv4 or an IPv6 address (without brackets)
  int port = 6379;
  std::string unix_path;  ///< when set, the server's Unix socket (host and port unused)
  int db = 0;
  /// Redis 6+ ACL: `AUTH user password` on every connection (`AUTH password` for the default
  /// user when `user` is empty). Never printed: redacted() and every message leave it out.
  std::string user, password;
  /// Entries are <prefix><32 hex digits>. One prefix per tenant lets an operator give each
  /// tenant an ACL user limited to its own keys (`~relokv:tenant-a:*`).
  std::string key_prefix = "relokv:";
  std::chrono::milliseconds connect_timeout{200};
  /// The deadline of each store call as a whole: connecting, logging in, sending the batch and
  /// every reply of it. A server that drips bytes, or never answers, costs at most this (plus
  /// the connect timeout when the call connects).
  std::chrono::milliseconds command_timeout{1000};
  std::chrono::milliseconds retry_interval{250};  ///< between reconnection attempts
  /// The largest value a reply may carry: a reply that announces more fails the call as its
  /// header arrives, before its bytes are held. A cache lowers it to the largest block its
  /// layout encodes to (limit_value_bytes), so a batched get of n keys holds at most n blocks
  /// plus one reply's 64 KiB of read buffer.
  std::size_t max_value_bytes = std::size_t{256} << 20;

  /// Parses a store URL:
  ///  - `redis://[USER[:PASSWORD]@]HOST[:PORT][/DB][?prefix=P]`, HOST a name, an IPv4 address
  ///    or `[IPv6]`; USER and PASSWORD may be percent-encoded (`%40` for `@`); `USER@HOST`
  ///    takes the password from the environment variable RELOKV_REDIS_PASSWORD;
  ///  - `unix:///PATH/TO/SOCKET[?db=N][&prefix=P]`;
  ///  - `HOST[:PORT]` alone.
  /// `rediss://` (TLS) is refused: this hiredis has no TLS. Passwords belong in the URL only
  /// where nothing else can carry them; they never appear in the error messages.
  /// @throws error naming what is wrong (with the URL redacted)
  [[nodiscard]] static redis_store_options from_url(const std::string& url) {
    redis_store_options o;
    const auto bad = [&url](const std::string& why) {
      return error("redis_store: bad URL '" + redact_url(url) + "': " + why +
                   " (expected redis://[USER[:PASSWORD]@]HOST[:PORT][/DB][?prefix=P] or "
                   "unix:///PATH[?db=N][&prefix=P])");
    };
    std::string s = url, query;
    bool is_unix = false;
    if (s.rfind("rediss://", 0) == 0)
      throw error("redis_store: '" + redact_url(url) +
                  "': TLS (rediss://) needs a hiredis built with SSL support, which this build "
                  "does not use");
    if (s.rfind("redis://", 0) == 0) {
      s = s.substr(8);
    } else if (s.rfind("unix://", 0) == 0) {
      s = s.substr(7);
      is_unix = true;
    } else if (s.find("://") != std::string::npos) {
      throw bad("unsupported scheme '" + s.substr(0, s.find("://")) + "'");
    }
    if (!is_unix) detail::url_credentials(s, bad, o.user, o.password);
    if (const auto q = s.find('?'); q != std::string::npos) {
      query = s.substr(q + 1);
      s.resize(q);
    }
    const auto parse_db = [&](const std::string& digits) {
      if (digits.empty() || digits.size() > 4 ||
          digits.find_first_not_of("0123456789") != std::string::npos)
        throw bad("database is not a number");
      o.db = std::stoi(digits);
    };
    // The query: prefix=P (and db=N for unix sockets), separated by '&'.
    for (std::size_t i = 0; !query.empty() && i <= query.size();) {
      const auto amp = std::min(query.find('&', i), query.size());
      const std::string kv = query.substr(i, amp - i);
      const auto eq = kv.find('=');
      const std::string k = kv.substr(0, eq), v = eq == std::string::npos ? "" : kv.substr(eq + 1);
      if (k == "prefix" && !v.empty())
        o.key_prefix = detail::url_decode(v, bad);
      else if (k == "db" && is_unix)
        parse_db(v);
      else
        throw bad("unknown or empty query parameter '" + k + "'");
      i = amp + 1;
    }
    if (is_unix) {
      if (s.empty() || s[0] != '/') throw bad("a Unix socket needs an absolute path");
      o.unix_path = s;
      return o;
    }
    if (const auto slash = s.find('/'); slash != std::string::npos) {
      parse_db(s.substr(slash + 1));
      s.resize(slash);
    }
    if (!s.empty() && s[0] == '[') {  // [IPv6]:port
      const auto close = s.find(']');
      if (close == std::string::npos) throw bad("unclosed '[' in an IPv6 address");
      const std::string rest = s.substr(close + 1);
      o.host = s.substr(1, close - 1);
      if (o.host.empty() ||
          o.host.find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos)
        throw bad("not an IPv6 address between the brackets");
      if (!rest.empty()) {
        if (rest[0] != ':') throw bad("text after the IPv6 address");
        o.port = detail::url_port(rest.substr(1), bad);
      }
      return o;
    }
    if (const auto colon = s.rfind(':'); colon != std::string::npos) {
      if (s.find(':') != colon) throw bad("an IPv6 address must be written in brackets");
      o.port = detail::url_port(s.substr(colon + 1), bad);
      s.resize(colon);
    }
    if (s.empty()) throw bad("no host");
    if (s.find_first_of(" @[]") != std::string::npos) throw bad("not a host name");
    o.host = s;
    return o;
  }

  /// The options as a URL without the password, for reports.
  [[nodiscard]] std::string redacted() const {
    std::string u = unix_path.empty() ? "redis://" : "unix://";
    if (unix_path.empty()) {
      if (!user.empty() || !password.empty()) u += user + (password.empty() ? "@" : ":***@");
      u += host.find(':') != std::string::npos ? "[" + host + "]" : host;
      u += ":" + std::to_string(port) + "/" + std::to_string(db);
    } else {
      u += unix_path + "?db=" + std::to_string(db);
    }
    return u;
  }
};

class redis_store {
 public:
  /// Connects lazily: a server that is not up yet is an unavailable store, not an error.
  explicit redis_store(redis_store_options opt = {}) : opt_(std::move(opt)) {
    if (opt_.unix_path.empty() && (opt_.port <= 0 || opt_.port > 65535 || opt_.host.empty()))
      throw error("redis_store: host must be set and port in [1, 65535]");
    if (opt_.key_prefix.empty()) throw error("redis_store: the key prefix must not be empty");
    detail::redis_link_options l;
    l.at = {opt_.host, opt_.port, opt_.unix_path};
    l.db = opt_.db;
    l.user = opt_.user;
    l.password = opt_.password;
    l.connect_timeout = opt_.connect_timeout;
    l.retry_interval = opt_.retry_interval;
    l.max_value_bytes = opt_.max_value_bytes;
    link_ = detail::redis_link(std::move(l));
  }
  redis_store(redis_store&&) noexcept = default;
  redis_store& operator=(redis_store&&) noexcept = default;

  store_status get(std::span<const store_key> keys, std::vector<store_blob>& out) {
    return get(keys, out, [](std::size_t, store_blob b) { return b; });
  }
  /// As get(keys, out), handing each entry found to `transform(i, blob)` as soon as its reply
  /// is in, while the rest of the batch is still arriving (sealed_store opens entries there);
  /// out[i] is what it returns.
  template <class Transform>
  store_status get(std::span<const store_key> keys, std::vector<store_blob>& out,
                   Transform&& transform) {
    ++c_.get_calls;
    c_.keys_requested += static_cast<std::int64_t>(keys.size());
    out.assign(keys.size(), store_blob{});
    if (keys.empty()) return store_status::kOk;
    // A pipeline of GETs, not one MGET: hiredis grows its read buffer by at most 1 MiB at a
    // time, so one reply of many blocks costs quadratic copying; one reply per block keeps
    // the buffer at a block's size.
    return attempt([&]() -> detail::redis_io {
      bool ok = true;
      const detail::redis_io r = pipeline("GET", keys, {}, [&](std::size_t i, redisReply* reply) {
        // A miss or another tenant's key (denied) leaves the rest of the call standing; an
        // error reply (e.g. WRONGTYPE) fails it once the rest is read.
        if (detail::redis_take_get(reply, i, out, transform, c_) == detail::redis_get_reply::kError)
          ok = false;
      });
      if (r != detail::redis_io::kOk || !ok) out.assign(keys.size(), store_blob{});
      return r != detail::redis_io::kOk ? r
             : ok                       ? detail::redis_io::kOk
                                        : detail::redis_io::kFailed;
    });
  }

  store_status put(std::span<const store_key> keys,
                   std::span<const std::span<const std::byte>> values) {
    ++c_.put_calls;
    const std::size_t n = std::min(keys.size(), values.size());
    if (n == 0) return store_status::kOk;
    bool all = true;
    const store_status st = attempt([&]() -> detail::redis_io {
      return pipeline("SET", keys.first(n), values.first(n), [&](std::size_t i, redisReply* r) {
        if (r->type != REDIS_REPLY_STATUS) {
          ++c_.put_rejected;  // e.g. OOM under maxmemory with noeviction, or not a SET's reply
          if (detail::redis_denied(r)) ++c_.denied;
          all = false;
        } else {
          ++c_.keys_written;
          c_.bytes_written += static_cast<std::int64_t>(values[i].size());
        }
        freeReplyObject(r);
      });
    });
    return st == store_status::kOk && !all ? store_status::kUnavailable : st;
  }

  store_status contains(std::span<const store_key> keys, std::vector<std::uint8_t>& out) {
    out.assign(keys.size(), 0);
    if (keys.empty()) return store_status::kOk;
    return attempt([&]() -> detail::redis_io {
      const detail::redis_io r =
          pipeline("EXISTS", keys, {}, [&](std::size_t i, redisReply* reply) {
            out[i] = reply->type == REDIS_REPLY_INTEGER && reply->integer > 0 ? 1 : 0;
            freeReplyObject(reply);
          });
      if (r != detail::redis_io::kOk) out.assign(keys.size(), 0);
      return r;
    });
  }

  store_status erase(std::span<const store_key> keys) {
    if (keys.empty()) return store_status::kOk;
    std::vector<std::string> args = {"DEL"};
    for (const store_key& k : keys) args.push_back(name_of(k));
    return attempt([&]() -> detail::redis_io {
      if (!link_.append(args)) return detail::redis_io::kFailed;
      bool ok = false;
      const detail::redis_io r = exchange(1, [&](std::size_t, redisReply* reply) {
        ok = reply->type == REDIS_REPLY_INTEGER;
        freeReplyObject(reply);
      });
      return r != detail::redis_io::kOk ? r
             : ok                       ? detail::redis_io::kOk
                                        : detail::redis_io::kFailed;
    });
  }

  [[nodiscard]] store_counters counters() const noexcept { return c_; }
  [[nodiscard]] const redis_store_options& options() const noexcept { return opt_; }
  /// Lowers max_value_bytes to n (never raises it): the cache passes the largest entry its
  /// layout encodes to, so one get of k keys holds at most k such replies (and one partial).
  void limit_value_bytes(std::size_t n) noexcept {
    opt_.max_value_bytes = std::min(opt_.max_value_bytes, n);
    link_.options().max_value_bytes = opt_.max_value_bytes;
  }
  /// The Redis key of an entry.
  [[nodiscard]] std::string name_of(const store_key& k) const { return opt_.key_prefix + k.hex(); }
  /// True when connected now, or connected by this call (at most one attempt per interval).
  bool connected() {
    return link_.connect(detail::redis_clock::now() + opt_.connect_timeout + opt_.command_timeout,
                         c_);
  }

 private:
  /// Runs `f` on a live connection, all of it (connecting and logging in included) before one
  /// deadline: the command timeout, plus the connect timeout when the call has to connect. A
  /// connection found stale (the server restarted or closed it) is replaced once, at once,
  /// within what is left of that deadline.
  template <class F>
  store_status attempt(F&& f) {
    deadline_ = detail::redis_clock::now() + opt_.command_timeout;
    if (!link_.up()) deadline_ += opt_.connect_timeout;
    for (int tries = 0; tries < 2; ++tries) {
      const bool reused = link_.up();
      if (!link_.connect(deadline_, c_)) break;
      const detail::redis_io r = f();
      if (r == detail::redis_io::kOk) return store_status::kOk;
      if (r != detail::redis_io::kStale || !reused) break;
      link_.retry_now();  // reconnect now, not after the retry interval
    }
    ++c_.unavailable;
    return store_status::kUnavailable;
  }
  /// Sends `cmd key` (or `cmd key value`, when values are given) for every key in one
  /// pipeline and hands each reply, in order, to on_reply(i, reply), which owns it.
  template <class OnReply>
  detail::redis_io pipeline(const char* cmd, std::span<const store_key> keys,
                            std::span<const std::span<const std::byte>> values,
                            OnReply&& on_reply) {
    const std::size_t cmd_len = std::strlen(cmd);
    const int argc = values.empty() ? 2 : 3;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::string name = name_of(keys[i]);
      const char* argv[3] = {
          cmd, name.data(),
          values.empty() ? nullptr : reinterpret_cast<const char*>(values[i].data())};
      const std::size_t len[3] = {cmd_len, name.size(), values.empty() ? 0 : values[i].size()};
      if (!link_.append(argc, argv, len)) return detail::redis_io::kFailed;
    }
    return exchange(keys.size(), on_reply);
  }
  /// Reads n replies to what was appended, before the call's deadline.
  template <class OnReply>
  detail::redis_io exchange(std::size_t n, OnReply&& on_reply) {
    detail::redis_part part{&link_, n};
    detail::redis_exchange(std::span<detail::redis_part>(&part, 1), deadline_, c_,
                           [&](std::size_t, std::size_t i, redisReply* r) { on_reply(i, r); });
    return part.result;
  }

  redis_store_options opt_;
  detail::redis_link link_;
  detail::redis_clock::time_point deadline_{};
  store_counters c_;
};

static_assert(kv_store<redis_store>, "redis_store must model kv_store");

RELOKV_NAMESPACE_END
