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
#include <fcntl.h>
#include <poll.h>
#include <sys/time.h>
#include <algorithm>
#include <cerrno>
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
  /// The largest value a reply may carry (a block of the largest layout served, with its
  /// header): a reply that announces or sends more fails the call before its bytes are held.
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
    // User information first, up to the last '@' (a password may hold '/', '?' or '@').
    if (const auto at = s.rfind('@'); at != std::string::npos && !is_unix) {
      const std::string info = s.substr(0, at);
      s = s.substr(at + 1);
      const auto colon = info.find(':');
      o.user = decode(info.substr(0, colon), bad);
      if (colon != std::string::npos) o.password = decode(info.substr(colon + 1), bad);
      // USER@HOST: the password from the environment, so that it need not be on a command
      // line (where ps shows it).
      if (o.password.empty())
        if (const char* env = std::getenv("RELOKV_REDIS_PASSWORD"); env != nullptr)
          o.password = env;
      if (o.password.empty())
        throw bad("user information without a password (in the URL or RELOKV_REDIS_PASSWORD)");
    }
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
        o.key_prefix = decode(v, bad);
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
        o.port = parse_port(rest.substr(1), bad);
      }
      return o;
    }
    if (const auto colon = s.rfind(':'); colon != std::string::npos) {
      if (s.find(':') != colon) throw bad("an IPv6 address must be written in brackets");
      o.port = parse_port(s.substr(colon + 1), bad);
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

 private:
  template <class Bad>
  static int parse_port(const std::string& digits, const Bad& bad) {
    if (digits.empty() || digits.size() > 5 ||
        digits.find_first_not_of("0123456789") != std::string::npos || std::stoi(digits) == 0 ||
        std::stoi(digits) > 65535)
      throw bad("port is not in [1, 65535]");
    return std::stoi(digits);
  }
  /// Percent-decoding (RFC 3986) of a URL component.
  template <class Bad>
  static std::string decode(const std::string& in, const Bad& bad) {
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
};

class redis_store {
 public:
  /// Connects lazily: a server that is not up yet is an unavailable store, not an error.
  explicit redis_store(redis_store_options opt = {}) : opt_(std::move(opt)) {
    if (opt_.unix_path.empty() && (opt_.port <= 0 || opt_.port > 65535 || opt_.host.empty()))
      throw error("redis_store: host must be set and port in [1, 65535]");
    if (opt_.key_prefix.empty()) throw error("redis_store: the key prefix must not be empty");
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
    return attempt([&]() -> io {
      bool ok = true;
      const io r = pipeline("GET", keys, {}, [&](std::size_t i, redisReply* reply) {
        std::shared_ptr<const redisReply> owner(
            reply, [](const redisReply* q) { freeReplyObject(const_cast<redisReply*>(q)); });
        if (reply->type == REDIS_REPLY_STRING) {
          out[i] = transform(
              i, store_blob(owner, {reinterpret_cast<const std::byte*>(reply->str), reply->len}));
          ++c_.keys_found;
          c_.bytes_read += static_cast<std::int64_t>(reply->len);
        } else if (denied(reply)) {
          ++c_.denied;  // another tenant's key: a miss, the call answers for the rest
        } else if (reply->type != REDIS_REPLY_NIL) {
          ok = false;  // an error reply (e.g. WRONGTYPE): read the rest, then fail the call
        }
      });
      if (r != io::kOk || !ok) out.assign(keys.size(), store_blob{});
      return r != io::kOk ? r : ok ? io::kOk : io::kFailed;
    });
  }

  store_status put(std::span<const store_key> keys,
                   std::span<const std::span<const std::byte>> values) {
    ++c_.put_calls;
    const std::size_t n = std::min(keys.size(), values.size());
    if (n == 0) return store_status::kOk;
    bool all = true;
    const store_status st = attempt([&]() -> io {
      return pipeline("SET", keys.first(n), values.first(n), [&](std::size_t i, redisReply* r) {
        if (r->type != REDIS_REPLY_STATUS) {
          ++c_.put_rejected;  // e.g. OOM under maxmemory with noeviction, or not a SET's reply
          if (denied(r)) ++c_.denied;
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
    return attempt([&]() -> io {
      const io r = pipeline("EXISTS", keys, {}, [&](std::size_t i, redisReply* reply) {
        out[i] = reply->type == REDIS_REPLY_INTEGER && reply->integer > 0 ? 1 : 0;
        freeReplyObject(reply);
      });
      if (r != io::kOk) out.assign(keys.size(), 0);
      return r;
    });
  }

  store_status erase(std::span<const store_key> keys) {
    if (keys.empty()) return store_status::kOk;
    args_.assign(1, "DEL");
    for (const store_key& k : keys) args_.push_back(name_of(k));
    return attempt([&]() -> io {
      redisReply* r = nullptr;
      if (const io e = command(r); e != io::kOk) return e;
      const bool ok = r->type == REDIS_REPLY_INTEGER;
      freeReplyObject(r);
      return ok ? io::kOk : io::kFailed;
    });
  }

  [[nodiscard]] store_counters counters() const noexcept { return c_; }
  [[nodiscard]] const redis_store_options& options() const noexcept { return opt_; }
  /// The Redis key of an entry.
  [[nodiscard]] std::string name_of(const store_key& k) const { return opt_.key_prefix + k.hex(); }
  /// True when connected now, or connected by this call (at most one attempt per interval).
  bool connected() {
    if (ctx_ && ctx_->err == 0) return true;
    ctx_.reset();
    const auto now = std::chrono::steady_clock::now();
    if (now < next_attempt_) return false;
    next_attempt_ = now + opt_.retry_interval;
    redisContext* c =
        opt_.unix_path.empty()
            ? redisConnectWithTimeout(opt_.host.c_str(), opt_.port, tv(opt_.connect_timeout))
            : redisConnectUnixWithTimeout(opt_.unix_path.c_str(), tv(opt_.connect_timeout));
    // The login and SELECT count against the call's deadline from here.
    deadline_ = std::max(deadline_, std::chrono::steady_clock::now() + opt_.command_timeout);
    if (c == nullptr) return false;
    ctx_.reset(c);
    if (c->err != 0 || redisSetTimeout(c, tv(opt_.command_timeout)) != REDIS_OK) {
      ctx_.reset();
      return false;
    }
    if (!opt_.password.empty()) {
      // AUTH [user] password: a refused login is counted (auth_failures) and the store is
      // unavailable; the password goes nowhere else.
      const char* argv[3] = {"AUTH", opt_.user.data(), opt_.password.data()};
      std::size_t len[3] = {4, opt_.user.size(), opt_.password.size()};
      int argc = 3;
      if (opt_.user.empty()) {  // the default user: AUTH password
        argv[1] = argv[2];
        len[1] = len[2];
        argc = 2;
      }
      bool ok = false;
      const io r = status_command(argc, argv, len, ok);
      if (r != io::kOk || !ok) {
        if (r == io::kOk) ++c_.auth_failures;
        ctx_.reset();
        return false;
      }
    }
    if (opt_.db != 0) {
      const std::string db = std::to_string(opt_.db);
      const char* argv[2] = {"SELECT", db.data()};
      const std::size_t len[2] = {6, db.size()};
      bool ok = false;
      const io r = status_command(2, argv, len, ok);
      if (r != io::kOk || !ok) {
        ctx_.reset();
        return false;
      }
    }
    if (ever_connected_) ++c_.reconnects;
    ever_connected_ = true;
    return true;
  }

 private:
  struct ctx_free {
    void operator()(redisContext* c) const noexcept { redisFree(c); }
  };
  static timeval tv(std::chrono::milliseconds ms) noexcept {
    timeval t{};
    t.tv_sec = static_cast<decltype(t.tv_sec)>(ms.count() / 1000);
    t.tv_usec = static_cast<decltype(t.tv_usec)>((ms.count() % 1000) * 1000);
    return t;
  }
  /// How a call on the connection went. kStale: the connection had died under us (the server
  /// restarted or closed it): worth one immediate reconnection. kFailed: anything else (a
  /// timeout, an error reply): not retried, so a slow server costs one timeout.
  enum class io { kOk, kFailed, kStale };
  /// Classifies the connection's error and drops the connection.
  io io_error() noexcept {
    const bool stale =
        ctx_ && (ctx_->err == REDIS_ERR_EOF ||
                 (ctx_->err == REDIS_ERR_IO && (errno == EPIPE || errno == ECONNRESET)));
    ctx_.reset();
    return stale ? io::kStale : io::kFailed;
  }
  /// An error reply of the ACL (the user may not touch this key).
  static bool denied(const redisReply* r) noexcept {
    return r->type == REDIS_REPLY_ERROR && r->len >= 6 && std::memcmp(r->str, "NOPERM", 6) == 0;
  }
  /// Runs `f` on a live connection; a connection found stale is replaced once, at once.
  template <class F>
  store_status attempt(F&& f) {
    deadline_ = std::chrono::steady_clock::now() + opt_.command_timeout;
    for (int tries = 0; tries < 2; ++tries) {
      const bool reused = ctx_ != nullptr && ctx_->err == 0;
      if (!connected()) break;
      const io r = f();
      if (r == io::kOk) return store_status::kOk;
      if (r != io::kStale || !reused) break;
      next_attempt_ = {};  // reconnect now, not after the retry interval
    }
    ++c_.unavailable;
    return store_status::kUnavailable;
  }
  /// Sends `cmd key` (or `cmd key value`, when values are given) for every key in one
  /// pipeline and hands each reply, in order, to on_reply(i, reply), which owns it.
  template <class OnReply>
  io pipeline(const char* cmd, std::span<const store_key> keys,
              std::span<const std::span<const std::byte>> values, OnReply&& on_reply) {
    const std::size_t cmd_len = std::strlen(cmd);
    const int argc = values.empty() ? 2 : 3;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::string name = name_of(keys[i]);
      const char* argv[3] = {
          cmd, name.data(),
          values.empty() ? nullptr : reinterpret_cast<const char*>(values[i].data())};
      const std::size_t len[3] = {cmd_len, name.size(), values.empty() ? 0 : values[i].size()};
      if (redisAppendCommandArgv(ctx_.get(), argc, argv, len) != REDIS_OK) return io_error();
    }
    return exchange(keys.size(), on_reply);
  }
  /// One command, one reply, within the call's deadline.
  template <class OnReply>
  io roundtrip(int argc, const char** argv, const std::size_t* len, OnReply&& on_reply) {
    if (redisAppendCommandArgv(ctx_.get(), argc, argv, len) != REDIS_OK) return io_error();
    return exchange(1, [&](std::size_t, redisReply* r) { on_reply(r); });
  }
  /// A command answered by a status (+OK): `ok` says whether it was.
  io status_command(int argc, const char** argv, const std::size_t* len, bool& ok) {
    return roundtrip(argc, argv, len, [&](redisReply* reply) {
      ok = reply->type == REDIS_REPLY_STATUS;
      freeReplyObject(reply);
    });
  }
  /// Sends what is buffered and reads `n` replies, all before the call's deadline: the socket
  /// is non-blocking meanwhile and every wait is a poll for the time left, so a server that
  /// drips bytes or never answers costs the deadline, not a timeout per system call. A reply
  /// whose bytes pass max_value_bytes fails the call before more of it is read.
  template <class OnReply>
  io exchange(std::size_t n, OnReply&& on_reply) {
    redisContext* c = ctx_.get();
    const int fl = ::fcntl(c->fd, F_GETFL);
    if (fl < 0 || ::fcntl(c->fd, F_SETFL, fl | O_NONBLOCK) != 0) return io_error();
    c->flags &= ~REDIS_BLOCK;  // hiredis then treats EAGAIN as "later", not as an error
    const io r = exchange_nonblocking(n, on_reply);
    if (ctx_) {  // io_error() may have dropped it
      ctx_->flags |= REDIS_BLOCK;
      (void)::fcntl(ctx_->fd, F_SETFL, fl);
    }
    return r;
  }
  template <class OnReply>
  io exchange_nonblocking(std::size_t n, OnReply& on_reply) {
    redisContext* c = ctx_.get();
    for (int done = 0; !done;) {
      if (redisBufferWrite(c, &done) != REDIS_OK) return io_error();
      if (!done && !wait_for(POLLOUT)) return timed_out();
    }
    const std::size_t bound = opt_.max_value_bytes + (std::size_t{64} << 10);
    for (std::size_t i = 0; i < n; ++i) {
      void* rv = nullptr;
      for (;;) {
        if (redisGetReplyFromReader(c, &rv) != REDIS_OK) return io_error();
        if (rv != nullptr) break;
        if (c->reader->len - c->reader->pos > bound) {  // one reply larger than any block
          ++c_.oversized;
          return drop();
        }
        if (!wait_for(POLLIN)) return timed_out();
        if (redisBufferRead(c) != REDIS_OK) return io_error();
      }
      on_reply(i, static_cast<redisReply*>(rv));
    }
    return io::kOk;
  }
  /// Waits until the socket is ready for `events` or the deadline passes (false).
  bool wait_for(short events) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline_ - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{ctx_->fd, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1 << 30)));
      if (r > 0) return true;
      if (r == 0) return false;
      if (errno != EINTR) return false;
    }
  }
  /// The deadline passed: the connection is dropped (its replies would arrive out of step).
  io timed_out() {
    ++c_.timeouts;
    return drop();
  }
  io drop() {
    ctx_.reset();
    return io::kFailed;
  }
  /// Sends args_ as one command. An error reply is kFailed (the connection stays).
  io command(redisReply*& reply) {
    argv_.clear();
    lens_.clear();
    for (const std::string& a : args_) {
      argv_.push_back(a.data());
      lens_.push_back(a.size());
    }
    reply = nullptr;
    const io r = roundtrip(static_cast<int>(argv_.size()), argv_.data(), lens_.data(),
                           [&](redisReply* got) { reply = got; });
    if (r != io::kOk) return r;
    if (reply->type == REDIS_REPLY_ERROR) {
      freeReplyObject(reply);
      reply = nullptr;
      return io::kFailed;
    }
    return io::kOk;
  }

  redis_store_options opt_;
  std::unique_ptr<redisContext, ctx_free> ctx_;
  std::chrono::steady_clock::time_point next_attempt_{}, deadline_{};
  bool ever_connected_ = false;
  store_counters c_;
  std::vector<std::string> args_;
  std::vector<const char*> argv_;
  std::vector<std::size_t> lens_;
};

static_assert(kv_store<redis_store>, "redis_store must model kv_store");

RELOKV_NAMESPACE_END
