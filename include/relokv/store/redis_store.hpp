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
#include <sys/time.h>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <hiredis/hiredis.h>

#include "relokv/concepts/kv_store.hpp"

RELOKV_NAMESPACE_BEGIN

struct redis_store_options {
  std::string host = "127.0.0.1";
  int port = 6379;
  int db = 0;
  std::string key_prefix = "relokv:";  ///< entries are <prefix><32 hex digits>
  std::chrono::milliseconds connect_timeout{200};
  std::chrono::milliseconds command_timeout{1000};  ///< bounds how long a plan waits
  std::chrono::milliseconds retry_interval{250};    ///< between reconnection attempts

  /// Parses `redis://HOST[:PORT][/DB]` (or `HOST[:PORT]`).
  /// @throws error naming what is wrong
  [[nodiscard]] static redis_store_options from_url(const std::string& url) {
    redis_store_options o;
    std::string s = url;
    if (s.rfind("redis://", 0) == 0) s = s.substr(8);
    const auto bad = [&url](const char* why) {
      return error("redis_store: bad URL '" + url + "': " + why +
                   " (expected redis://HOST[:PORT][/DB])");
    };
    if (const auto slash = s.find('/'); slash != std::string::npos) {
      const std::string db = s.substr(slash + 1);
      s.resize(slash);
      if (db.empty() || db.size() > 4 || db.find_first_not_of("0123456789") != std::string::npos)
        throw bad("database is not a number");
      o.db = std::stoi(db);
    }
    if (const auto colon = s.rfind(':'); colon != std::string::npos) {
      const std::string port = s.substr(colon + 1);
      s.resize(colon);
      if (port.empty() || port.size() > 5 ||
          port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) == 0 ||
          std::stoi(port) > 65535)
        throw bad("port is not in [1, 65535]");
      o.port = std::stoi(port);
    }
    if (s.empty()) throw bad("no host");
    o.host = s;
    return o;
  }
};

class redis_store {
 public:
  /// Connects lazily: a server that is not up yet is an unavailable store, not an error.
  explicit redis_store(redis_store_options opt = {}) : opt_(std::move(opt)) {
    if (opt_.port <= 0 || opt_.port > 65535 || opt_.host.empty())
      throw error("redis_store: host must be set and port in [1, 65535]");
  }
  redis_store(redis_store&&) noexcept = default;
  redis_store& operator=(redis_store&&) noexcept = default;

  store_status get(std::span<const store_key> keys, std::vector<store_blob>& out) {
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
          out[i] = store_blob(owner, {reinterpret_cast<const std::byte*>(reply->str), reply->len});
          ++c_.keys_found;
          c_.bytes_read += static_cast<std::int64_t>(reply->len);
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
        if (r->type == REDIS_REPLY_ERROR) {
          ++c_.put_rejected;  // e.g. OOM under maxmemory with noeviction
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
        redisConnectWithTimeout(opt_.host.c_str(), opt_.port, tv(opt_.connect_timeout));
    if (c == nullptr) return false;
    ctx_.reset(c);
    if (c->err != 0 || redisSetTimeout(c, tv(opt_.command_timeout)) != REDIS_OK) {
      ctx_.reset();
      return false;
    }
    if (opt_.db != 0) {
      auto* r = static_cast<redisReply*>(redisCommand(c, "SELECT %d", opt_.db));
      const bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
      if (r != nullptr) freeReplyObject(r);
      if (!ok) {
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
  /// Runs `f` on a live connection; a connection found stale is replaced once, at once.
  template <class F>
  store_status attempt(F&& f) {
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
    for (std::size_t i = 0; i < keys.size(); ++i) {
      void* rv = nullptr;
      if (redisGetReply(ctx_.get(), &rv) != REDIS_OK || rv == nullptr) return io_error();
      on_reply(i, static_cast<redisReply*>(rv));
    }
    return io::kOk;
  }
  /// Sends args_ as one command. An error reply is kFailed (the connection stays).
  io command(redisReply*& reply) {
    argv_.clear();
    lens_.clear();
    for (const std::string& a : args_) {
      argv_.push_back(a.data());
      lens_.push_back(a.size());
    }
    void* r =
        redisCommandArgv(ctx_.get(), static_cast<int>(argv_.size()), argv_.data(), lens_.data());
    if (r == nullptr || ctx_->err != 0) {
      if (r != nullptr) freeReplyObject(r);
      return io_error();
    }
    reply = static_cast<redisReply*>(r);
    if (reply->type == REDIS_REPLY_ERROR) {
      freeReplyObject(reply);
      reply = nullptr;
      return io::kFailed;
    }
    return io::kOk;
  }

  redis_store_options opt_;
  std::unique_ptr<redisContext, ctx_free> ctx_;
  std::chrono::steady_clock::time_point next_attempt_{};
  bool ever_connected_ = false;
  store_counters c_;
  std::vector<std::string> args_;
  std::vector<const char*> argv_;
  std::vector<std::size_t> lens_;
};

static_assert(kv_store<redis_store>, "redis_store must model kv_store");

RELOKV_NAMESPACE_END
