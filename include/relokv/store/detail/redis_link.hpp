#pragma once
/// @file
/// One connection to one Redis server, and the exchange of pipelines with one or several
/// servers at once under one deadline: what redis_store and redis_cluster_store share. Needs
/// hiredis (only the Redis stores include it).
///
/// Every wait is a poll for the time left before the call's deadline, on non-blocking sockets,
/// so a server that drips bytes or never answers costs the deadline, not a timeout per system
/// call; several servers are waited on together, so a call's time is the slowest server's,
/// not their sum. Every reply is bounded before it is held: a bulk reply that announces more
/// than the largest value fails its server's part as its header arrives, and an array reply
/// (which hiredis builds element by element, out of any buffer bound) is refused as its header
/// is parsed unless the caller asked for one with a bound on its elements (CLUSTER SLOTS).
#include <fcntl.h>
#include <poll.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <hiredis/hiredis.h>

#include "relokv/concepts/kv_store.hpp"

RELOKV_NAMESPACE_BEGIN
namespace detail {

using redis_clock = std::chrono::steady_clock;

/// Where a server listens, and how a connection to it logs in.
struct redis_endpoint {
  std::string host = "127.0.0.1";  ///< a name, an IPv4 or an IPv6 address (without brackets)
  int port = 6379;
  std::string unix_path;  ///< when set, the server's Unix socket (host and port unused)
  /// `host:port` (`[v6]:port`), or the socket's path: how reports and the cluster name it.
  [[nodiscard]] std::string name() const {
    if (!unix_path.empty()) return unix_path;
    const bool v6 = host.find(':') != std::string::npos;
    return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
};

struct redis_link_options {
  redis_endpoint at;
  int db = 0;
  /// Redis 6+ ACL: `AUTH user password` (`AUTH password` for the default user when `user` is
  /// empty) on every connection. Never printed.
  std::string user, password;
  bool readonly = false;  ///< send READONLY after logging in (reads from a cluster replica)
  std::chrono::milliseconds connect_timeout{200};
  std::chrono::milliseconds retry_interval{250};         ///< between connection attempts
  std::size_t max_value_bytes = std::size_t{256} << 20;  ///< the largest bulk reply held
};

/// How a server's part of an exchange went. kStale: the connection had died under us (the
/// server restarted or closed it): worth one immediate reconnection. kFailed: anything else
/// (a timeout, a refused reply, a server gone mid-reply): not retried in the call.
enum class redis_io : std::uint8_t { kOk, kFailed, kStale };

/// One connection, made lazily and remade after a failure (at most one attempt per retry
/// interval, so a server that is down costs nothing between attempts).
class redis_link {
 public:
  redis_link() = default;
  explicit redis_link(redis_link_options o) : o_(std::move(o)) {}
  redis_link(redis_link&&) noexcept = default;
  redis_link& operator=(redis_link&&) noexcept = default;

  [[nodiscard]] const redis_link_options& options() const noexcept { return o_; }
  redis_link_options& options() noexcept { return o_; }
  [[nodiscard]] bool up() const noexcept { return ctx_ && ctx_->err == 0; }
  /// True when the last connection attempt failed and the retry interval has not passed.
  [[nodiscard]] bool resting() const noexcept {
    return !up() && redis_clock::now() < next_attempt_;
  }
  /// Lets the next connect() try at once (a connection found stale is worth one retry).
  void retry_now() noexcept { next_attempt_ = {}; }
  void drop() noexcept { ctx_.reset(); }

  /// Connects (and logs in) when not connected, unless an attempt failed less than the retry
  /// interval ago. The connection and the login are bounded by `deadline` (and the connection
  /// by the connect timeout). Counts auth_failures and reconnects in `c`.
  bool connect(redis_clock::time_point deadline, store_counters& c) {
    if (up()) return true;
    ctx_.reset();
    const auto now = redis_clock::now();
    if (now < next_attempt_) return false;
    next_attempt_ = now + o_.retry_interval;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    if (left.count() <= 0) return false;
    const timeval t = tv(std::min(o_.connect_timeout, left));
    redisContext* ctx = o_.at.unix_path.empty()
                            ? redisConnectWithTimeout(o_.at.host.c_str(), o_.at.port, t)
                            : redisConnectUnixWithTimeout(o_.at.unix_path.c_str(), t);
    if (ctx == nullptr) return false;
    ctx_.reset(ctx);
    guard_replies(ctx);
    if (ctx->err != 0) {
      ctx_.reset();
      return false;
    }
    if (!o_.password.empty()) {
      // A refused login is counted and the server is unavailable; the password goes nowhere
      // else.
      std::vector<std::string> auth = {"AUTH"};
      if (!o_.user.empty()) auth.push_back(o_.user);
      auth.push_back(o_.password);
      bool refused = false;
      if (!status_command(auth, deadline, c, refused)) {
        if (refused) ++c.auth_failures;
        ctx_.reset();
        return false;
      }
    }
    bool refused = false;
    if (o_.db != 0 && !status_command({"SELECT", std::to_string(o_.db)}, deadline, c, refused)) {
      ctx_.reset();
      return false;
    }
    if (o_.readonly && !status_command({"READONLY"}, deadline, c, refused)) {
      ctx_.reset();
      return false;
    }
    if (ever_connected_) ++c.reconnects;
    ever_connected_ = true;
    return true;
  }

  /// Buffers one command (sent by the next exchange). False (and the connection dropped) when
  /// hiredis cannot buffer it.
  bool append(int argc, const char** argv, const std::size_t* len) {
    if (!up() || redisAppendCommandArgv(ctx_.get(), argc, argv, len) != REDIS_OK) {
      ctx_.reset();
      return false;
    }
    return true;
  }
  bool append(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> len;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      len.push_back(a.size());
    }
    return append(static_cast<int>(args.size()), argv.data(), len.data());
  }

  /// Lets the next replies hold arrays of at most `elements` elements in all (nested ones
  /// included); 0 refuses arrays again. For commands whose answer is an array (CLUSTER SLOTS).
  void allow_arrays(std::size_t elements) noexcept {
    array_budget_ = elements;
    if (ctx_) ctx_->reader->privdata = elements > 0 ? &array_budget_ : nullptr;
  }

  [[nodiscard]] redisContext* context() const noexcept { return ctx_.get(); }

 private:
  /// Sends one command and reads its status reply. `refused`: the server answered with an
  /// error (a wrong password, an unknown database).
  bool status_command(const std::vector<std::string>& args, redis_clock::time_point deadline,
                      store_counters& c, bool& refused);

  /// An array reply is refused the moment its header is parsed (hiredis reports it as
  /// REDIS_ERR_OOM), before one element is allocated, unless the reader's privdata points to
  /// a budget of elements that covers it.
  static void* create_array(const redisReadTask* task, int elements) noexcept {
    auto* budget = static_cast<std::size_t*>(task->privdata);
    if (budget == nullptr || elements < 0 || static_cast<std::size_t>(elements) > *budget)
      return nullptr;
    *budget -= static_cast<std::size_t>(elements);
    return hiredis_functions().createArray(task, elements);
  }
  static redisReplyObjectFunctions& hiredis_functions() noexcept {
    static redisReplyObjectFunctions own{};
    return own;
  }
  static void guard_replies(redisContext* ctx) noexcept {
    static redisReplyObjectFunctions table{};
    static const bool init = [ctx] {
      hiredis_functions() = *ctx->reader->fn;  // hiredis' own functions for everything else
      table = *ctx->reader->fn;
      table.createArray = &create_array;
      return true;
    }();
    (void)init;
    ctx->reader->fn = &table;
    ctx->reader->privdata = nullptr;
  }

  struct ctx_free {
    void operator()(redisContext* ctx) const noexcept { redisFree(ctx); }
  };
  static timeval tv(std::chrono::milliseconds ms) noexcept {
    timeval t{};
    t.tv_sec = static_cast<decltype(t.tv_sec)>(ms.count() / 1000);
    t.tv_usec = static_cast<decltype(t.tv_usec)>((ms.count() % 1000) * 1000);
    return t;
  }

  redis_link_options o_;
  std::unique_ptr<redisContext, ctx_free> ctx_;
  redis_clock::time_point next_attempt_{};
  bool ever_connected_ = false;
  std::size_t array_budget_ = 0;
};

/// One server's part of an exchange: the link whose buffered commands are sent, and how many
/// replies to read back. `result` says how it went.
struct redis_part {
  redis_link* link = nullptr;
  std::size_t replies = 0;
  std::size_t got = 0;
  redis_io result = redis_io::kOk;
  bool written = false, finished = false;
};

/// The length a bulk reply announces, once its header is in the reader's buffer and before its
/// bytes are: hiredis would wait for all of them (and hold them) before handing the reply
/// over. -1 when no such header is pending.
inline long long redis_announced_bulk(const redisReader* r) noexcept {
  const char* p = r->buf + r->pos;
  std::size_t avail = r->len - r->pos;
  if (r->ridx == 0 && r->rstack[0].type == REDIS_REPLY_STRING) {
    // hiredis consumed the '$' and waits for the rest: the digits are at the cursor.
  } else if (r->ridx == -1 && avail > 0 && p[0] == '$') {
    ++p;
    --avail;
  } else {
    return -1;
  }
  long long n = 0;
  for (std::size_t i = 0; i < avail; ++i) {
    if (p[i] < '0' || p[i] > '9') return i == 0 ? -1 : n;  // '-1': nil; '\r': the end
    if (n > (LLONG_MAX - 9) / 10) return LLONG_MAX;        // past any bound, no overflow
    n = n * 10 + (p[i] - '0');
  }
  return n;
}

/// Sends what each part's link has buffered and reads its replies, all parts at once, before
/// `deadline`; hands each reply to on_reply(part, i, reply), which owns it. A part whose
/// server fails (gone, silent past the deadline, an oversized or refused reply) ends with
/// kFailed or kStale and its link dropped (its replies would come out of step); the others
/// go on. Counts timeouts, oversized and malformed replies in `c`.
template <class OnReply>
void redis_exchange(std::span<redis_part> parts, redis_clock::time_point deadline,
                    store_counters& c, OnReply&& on_reply) {
  const auto fail = [](redis_part& p, redis_io why) {
    p.result = why;
    p.finished = true;
    p.link->drop();
  };
  // The link's error, classified: a connection that died under us is stale.
  const auto io_error = [&fail](redis_part& p) {
    redisContext* ctx = p.link->context();
    const bool stale =
        ctx != nullptr && (ctx->err == REDIS_ERR_EOF ||
                           (ctx->err == REDIS_ERR_IO && (errno == EPIPE || errno == ECONNRESET)));
    fail(p, stale ? redis_io::kStale : redis_io::kFailed);
  };
  std::vector<int> flags(parts.size(), -1);
  for (std::size_t k = 0; k < parts.size(); ++k) {
    redis_part& p = parts[k];
    p.got = 0;
    p.written = p.finished = false;
    p.result = redis_io::kOk;
    redisContext* ctx = p.link->context();
    if (ctx == nullptr || ctx->err != 0) {
      fail(p, redis_io::kFailed);
      continue;
    }
    flags[k] = ::fcntl(ctx->fd, F_GETFL);
    if (flags[k] < 0 || ::fcntl(ctx->fd, F_SETFL, flags[k] | O_NONBLOCK) != 0) {
      fail(p, redis_io::kFailed);
      continue;
    }
    ctx->flags &= ~REDIS_BLOCK;  // hiredis then treats EAGAIN as "later", not as an error
  }
  std::vector<pollfd> fds;
  std::vector<std::size_t> which;
  for (;;) {
    fds.clear();
    which.clear();
    for (std::size_t k = 0; k < parts.size(); ++k) {
      redis_part& p = parts[k];
      if (p.finished) continue;
      redisContext* ctx = p.link->context();
      if (!p.written) {
        int done = 0;
        if (redisBufferWrite(ctx, &done) != REDIS_OK) {
          io_error(p);
          continue;
        }
        p.written = done != 0;
      }
      if (p.written) {
        const std::size_t bound = p.link->options().max_value_bytes + (std::size_t{64} << 10);
        bool failed = false;
        while (p.got < p.replies) {
          void* rv = nullptr;
          if (redisGetReplyFromReader(ctx, &rv) != REDIS_OK) {
            if (ctx->err == REDIS_ERR_OOM) ++c.malformed;  // an array, refused
            io_error(p);
            failed = true;
            break;
          }
          if (rv == nullptr) {
            // One reply larger than any value: refused when its header announces it, or (a
            // header without a length) when its bytes pass the bound.
            const long long announced = redis_announced_bulk(ctx->reader);
            if ((announced >= 0 &&
                 static_cast<unsigned long long>(announced) > p.link->options().max_value_bytes) ||
                ctx->reader->len - ctx->reader->pos > bound) {
              ++c.oversized;
              fail(p, redis_io::kFailed);
              failed = true;
            }
            break;
          }
          on_reply(k, p.got++, static_cast<redisReply*>(rv));
        }
        if (failed) continue;
        if (p.got == p.replies) {
          p.finished = true;
          continue;
        }
      }
      fds.push_back(pollfd{ctx->fd, static_cast<short>(p.written ? POLLIN : POLLOUT), 0});
      which.push_back(k);
    }
    if (fds.empty()) break;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - redis_clock::now());
    int r = 0;
    if (left.count() > 0) {
      r = ::poll(fds.data(), fds.size(),
                 static_cast<int>(std::min<std::int64_t>(left.count(), 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
    }
    if (r <= 0) {
      // The deadline passed (or poll failed): every part still waiting is dropped.
      for (const std::size_t k : which) {
        ++c.timeouts;
        fail(parts[k], redis_io::kFailed);
      }
      break;
    }
    for (std::size_t j = 0; j < fds.size(); ++j) {
      redis_part& p = parts[which[j]];
      if (fds[j].revents == 0 || !p.written) continue;  // POLLOUT: the next pass writes
      if (redisBufferRead(p.link->context()) != REDIS_OK) io_error(p);
    }
  }
  for (std::size_t k = 0; k < parts.size(); ++k) {
    redisContext* ctx = parts[k].link->context();
    if (ctx == nullptr || flags[k] < 0) continue;
    ctx->flags |= REDIS_BLOCK;
    (void)::fcntl(ctx->fd, F_SETFL, flags[k]);
  }
}

inline bool redis_link::status_command(const std::vector<std::string>& args,
                                       redis_clock::time_point deadline, store_counters& c,
                                       bool& refused) {
  refused = false;
  if (!append(args)) return false;
  bool ok = false;
  redis_part part{this, 1};
  redis_exchange(std::span<redis_part>(&part, 1), deadline, c,
                 [&](std::size_t, std::size_t, redisReply* reply) {
                   ok = reply->type == REDIS_REPLY_STATUS;
                   refused = reply->type == REDIS_REPLY_ERROR;
                   freeReplyObject(reply);
                 });
  return part.result == redis_io::kOk && ok;
}

/// An error reply of the ACL (the user may not touch this key).
inline bool redis_denied(const redisReply* r) noexcept {
  return r->type == REDIS_REPLY_ERROR && r->len >= 6 && std::memcmp(r->str, "NOPERM", 6) == 0;
}

/// What a GET's reply was, once taken (redis_take_get).
enum class redis_get_reply : std::uint8_t { kFound, kMiss, kError };

/// Takes one GET's reply (and owns it): a bulk string becomes out[i] = transform(i, blob), the
/// blob keeping the reply alive (counted keys_found, bytes_read); nil is a miss; an ACL refusal
/// (NOPERM: another tenant's key) a miss counted `denied`; anything else (an error such as
/// WRONGTYPE) kError, for the caller to judge.
template <class Transform>
redis_get_reply redis_take_get(redisReply* reply, std::size_t i, std::vector<store_blob>& out,
                               Transform& transform, store_counters& c) {
  std::shared_ptr<const redisReply> owner(
      reply, [](const redisReply* q) { freeReplyObject(const_cast<redisReply*>(q)); });
  if (reply->type == REDIS_REPLY_STRING) {
    out[i] = transform(
        i, store_blob(owner, {reinterpret_cast<const std::byte*>(reply->str), reply->len}));
    ++c.keys_found;
    c.bytes_read += static_cast<std::int64_t>(reply->len);
    return redis_get_reply::kFound;
  }
  if (redis_denied(reply)) {
    ++c.denied;
    return redis_get_reply::kMiss;
  }
  return reply->type == REDIS_REPLY_NIL ? redis_get_reply::kMiss : redis_get_reply::kError;
}

}  // namespace detail
RELOKV_NAMESPACE_END
