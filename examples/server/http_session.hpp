#pragma once
// The inside of relokv_server's HTTP layer (http.hpp), for http.cpp alone: the server's state
// (listeners, limits, counters, the sessions alive) and one connection's session, a template
// over its stream (plain TCP or TLS): reading a request within the limits, dispatching it,
// writing whole or streamed responses, watching for the client leaving.
#include "http.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

namespace relokv_server::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

namespace detail {

struct route_entry {
  std::string method, path;
  handler h;
  bool offload = false;
};

/// The layer's own refusals, in OpenAI's error shape (fixed ASCII messages: no escaping).
inline std::string error_body(const char* message, const char* code) {
  return std::string(R"({"error":{"message":")") + message +
         R"(","type":"invalid_request_error","param":null,"code":")" + code + "\"}}";
}

}  // namespace detail

struct server::impl {
  struct listener {
    tcp::acceptor acceptor;
    std::shared_ptr<net::ssl::context> tls;
    std::vector<std::string> allowed;
    std::string name;
  };

  limits lim;
  std::vector<detail::route_entry> routes;
  mutable std::mutex mu;  // c and per_client
  counters c;
  std::map<std::string, std::size_t> per_client;
  /// Sessions alive, each with what breaks its own cycles (a session holds itself while a
  /// handler answers): stop() calls them once the I/O thread has ended.
  std::mutex live_mu;
  std::map<std::uint64_t, std::function<void()>> live;
  std::uint64_t next_session = 0;
  std::atomic<bool> draining{false};
  /// Sessions with a response begun and not yet written whole nor given up (server::answering).
  std::atomic<int> answering{0};
  bool stopped = false;
  // Declared after what sessions touch as they are destroyed (with the I/O context), and
  // before what must go first: the listeners' acceptors, then the workers.
  net::io_context ioc{1};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> guard;
  std::vector<std::unique_ptr<listener>> listeners;
  net::thread_pool workers;
  std::thread io_thread;

  impl(limits l, int w) : lim(l), workers(static_cast<std::size_t>(std::max(w, 1))) {}

  bool admit(const std::string& peer) {
    const std::lock_guard lock(mu);
    std::size_t& n = per_client[peer];
    if (static_cast<std::size_t>(c.connections_open) >= lim.max_connections ||
        n >= lim.max_connections_per_client) {
      if (n == 0) per_client.erase(peer);
      ++c.connections_refused;
      return false;
    }
    ++n;
    ++c.connections_open;
    return true;
  }
  void release(const std::string& peer) {
    const std::lock_guard lock(mu);
    if (const auto it = per_client.find(peer); it != per_client.end() && --it->second == 0)
      per_client.erase(it);
    --c.connections_open;
  }
  std::uint64_t enroll(std::function<void()> abandon) {
    const std::lock_guard lock(live_mu);
    live.emplace(++next_session, std::move(abandon));
    return next_session;
  }
  void withdraw(std::uint64_t id) {
    const std::lock_guard lock(live_mu);
    live.erase(id);
  }
  void count(std::int64_t counters::*field) {
    const std::lock_guard lock(mu);
    ++(c.*field);
  }
  void accept(listener& l);
};

namespace detail {

template <class Stream>
class session;

/// The reply of one request of a session: posts to the session's strand; a call meant for an
/// earlier request (the session has moved on) or a session gone is ignored.
template <class Stream>
class reply_impl final : public reply {
 public:
  reply_impl(std::weak_ptr<session<Stream>> s, std::uint64_t seq, net::any_io_executor ex)
      : s_(std::move(s)), seq_(seq), ex_(std::move(ex)) {}
  void send(int status, std::string content_type, std::string body, header_list extra) override {
    net::post(ex_, [s = s_, seq = seq_, status, ct = std::move(content_type), b = std::move(body),
                    e = std::move(extra)]() mutable {
      if (auto p = s.lock()) p->do_send(seq, status, std::move(ct), std::move(b), std::move(e));
    });
  }
  void stream(int status, std::string content_type, header_list extra,
              std::function<std::pair<std::string, bool>()> pull) override {
    net::post(ex_, [s = s_, seq = seq_, status, ct = std::move(content_type), e = std::move(extra),
                    pull = std::move(pull)]() mutable {
      if (auto p = s.lock())
        p->do_stream(seq, status, std::move(ct), std::move(e), std::move(pull));
    });
  }
  void notify() override {
    net::post(ex_, [s = s_, seq = seq_] {
      if (auto p = s.lock()) p->do_notify(seq);
    });
  }
  void post(std::function<void()> f) override {
    net::post(ex_, [s = s_, seq = seq_, f = std::move(f)] {
      if (auto p = s.lock()) p->do_post(seq, f);
    });
  }
  void on_disconnect(std::function<void()> f) override {
    net::post(ex_, [s = s_, seq = seq_, f = std::move(f)]() mutable {
      if (auto p = s.lock()) p->do_on_disconnect(seq, std::move(f));
    });
  }

 private:
  std::weak_ptr<session<Stream>> s_;
  std::uint64_t seq_;
  net::any_io_executor ex_;
};

template <class Stream>
class session : public std::enable_shared_from_this<session<Stream>> {
 public:
  session(server::impl& srv, server::impl::listener& l, Stream stream, std::string peer)
      : srv_(srv), listener_(l), stream_(std::move(stream)), peer_(std::move(peer)) {}
  ~session() {
    srv_.withdraw(id_);
    srv_.release(peer_);
  }

  void start() {
    id_ = srv_.enroll([w = this->weak_from_this()] {
      if (auto s = w.lock()) s->abandon();
    });
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      read_request();
    } else {
      lowest().expires_after(srv_.lim.request_timeout);
      stream_.async_handshake(net::ssl::stream_base::server,
                              [self = this->shared_from_this()](const error_code& ec) {
                                if (ec) return self->close();
                                self->read_request();
                              });
    }
  }

  // The reply's calls, on the strand.
  void do_send(std::uint64_t seq, int status, std::string ct, std::string body, header_list extra) {
    if (seq != seq_ || phase_ != phase::handling) return;
    phase_ = phase::writing;
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(
        static_cast<bhttp::status>(status), version_);
    res->set(bhttp::field::server, "relokv");
    res->set(bhttp::field::content_type, ct);
    for (auto& [k, v] : extra) res->set(k, v);
    res->body() = std::move(body);
    res->keep_alive(keep_alive_ && !srv_.draining);
    res->prepare_payload();
    lowest().expires_after(srv_.lim.write_timeout);
    bhttp::async_write(stream_, *res,
                       [self = this->shared_from_this(), res](const error_code& ec, std::size_t) {
                         if (ec) return self->gone();
                         self->response_done(res->keep_alive());
                       });
  }
  void do_stream(std::uint64_t seq, int status, std::string ct, header_list extra,
                 std::function<std::pair<std::string, bool>()> pull) {
    if (seq != seq_ || phase_ != phase::handling) return;
    phase_ = phase::streaming;
    pull_ = std::move(pull);
    head_.emplace(static_cast<bhttp::status>(status), version_);
    head_->set(bhttp::field::server, "relokv");
    head_->set(bhttp::field::content_type, ct);
    for (auto& [k, v] : extra) head_->set(k, v);
    head_->keep_alive(keep_alive_ && !srv_.draining);
    head_->chunked(true);
    head_sr_.emplace(*head_);
    writing_ = true;
    lowest().expires_after(srv_.lim.write_timeout);
    bhttp::async_write_header(stream_, *head_sr_,
                              [self = this->shared_from_this()](const error_code& ec, std::size_t) {
                                self->writing_ = false;
                                if (ec) return self->gone();
                                self->pump();
                              });
  }
  void do_notify(std::uint64_t seq) {
    if (seq == seq_) pump();
  }
  void do_post(std::uint64_t seq, const std::function<void()>& f) {
    if (seq == seq_ && phase_ != phase::closed) f();
  }
  void do_on_disconnect(std::uint64_t seq, std::function<void()> f) {
    if (seq != seq_) return;
    if (phase_ == phase::closed && !responded_whole_) {
      f();  // already gone
      return;
    }
    on_gone_ = std::move(f);
  }

 private:
  enum class phase { reading, handling, writing, streaming, closed };

  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }

  void read_request() {
    phase_ = phase::reading;
    responded_whole_ = false;
    on_gone_ = {};
    parser_.emplace();
    // Beast's own count leaves the start line out: it bounds the memory, and the exact limit
    // (every byte of the head) is checked on what the parser consumed (on_header).
    parser_->header_limit(srv_.lim.max_header_bytes + 1024);
    parser_->body_limit(srv_.lim.max_body_bytes);
    // One deadline for the request's whole arrival: the wait for it, its headers and body.
    const auto limit = first_ ? srv_.lim.request_timeout
                              : std::min(srv_.lim.request_timeout, srv_.lim.idle_timeout);
    deadline_ = std::chrono::steady_clock::now() + limit;
    lowest().expires_after(limit);
    first_ = false;
    bhttp::async_read_header(stream_, buf_, *parser_,
                             [self = this->shared_from_this()](
                                 const error_code& ec, std::size_t n) { self->on_header(ec, n); });
  }

  void on_header(const error_code& ec, std::size_t head_bytes) {
    if (ec == bhttp::error::header_limit || (!ec && head_bytes > srv_.lim.max_header_bytes)) {
      srv_.count(&counters::header_too_large);
      return refuse(431, "the request's headers are larger than --max-header-bytes",
                    "header_too_large");
    }
    // (A Content-Length over the body limit is seen here, in the header.)
    if (read_failed(ec)) return;
    const auto& req = parser_->get();
    version_ = req.version();
    if (static_cast<std::size_t>(std::distance(req.begin(), req.end())) >
        srv_.lim.max_header_fields) {
      srv_.count(&counters::header_too_large);
      return refuse(431, "the request has more header fields than --max-header-fields",
                    "header_too_large");
    }
    if (srv_.draining) return refuse(503, "the server is shutting down", "draining");
    if (const auto enc = req[bhttp::field::content_encoding];
        !enc.empty() && !beast::iequals(enc, "identity")) {
      srv_.count(&counters::encoding_refused);
      return refuse(415, "compressed request bodies are not accepted (Content-Encoding)",
                    "unsupported_encoding");
    }
    if (const auto n = parser_->content_length(); n && *n > srv_.lim.max_body_bytes) {
      srv_.count(&counters::body_too_large);
      return refuse(413, "the request body is larger than --max-body", "body_too_large");
    }
    if (beast::iequals(req[bhttp::field::expect], "100-continue")) {
      auto cont =
          std::make_shared<bhttp::response<bhttp::empty_body>>(bhttp::status::continue_, version_);
      bhttp::async_write(stream_, *cont,
                         [self = this->shared_from_this(), cont](const error_code& e, std::size_t) {
                           if (e) return self->close();
                           self->read_body();
                         });
      return;
    }
    read_body();
  }

  /// Whether a read ended by the request's deadline (Beast reports error::timeout, or, as its
  /// timer closed the socket first, the error of the closed socket).
  bool timed_out(const error_code& ec) const {
    return ec == beast::error::timeout || std::chrono::steady_clock::now() >= deadline_;
  }

  void read_body() {
    bhttp::async_read(stream_, buf_, *parser_,
                      [self = this->shared_from_this()](const error_code& ec, std::size_t) {
                        self->on_body(ec);
                      });
  }

  void on_body(const error_code& ec) {
    if (!read_failed(ec)) dispatch();
  }

  /// A read of the request that ended in error, and what it gets: 413 past the body limit, 400
  /// for what is not HTTP, otherwise the connection closes (a passed deadline counted). False
  /// when there was no error.
  bool read_failed(const error_code& ec) {
    if (!ec) return false;
    if (ec == bhttp::error::body_limit) {
      srv_.count(&counters::body_too_large);
      refuse(413, "the request body is larger than --max-body", "body_too_large");
      return true;
    }
    if (timed_out(ec)) srv_.count(&counters::timeouts);
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category())
      refuse(400, "malformed HTTP request", "bad_request");  // not HTTP: say so, then close
    else
      close();
    return true;
  }

  void dispatch() {
    auto& req = parser_->get();
    keep_alive_ = req.keep_alive();
    lowest().expires_never();  // the answer may take long: the watcher notices a client leaving
    const std::string_view target(req.target().data(), req.target().size());
    const std::string path(target.substr(0, target.find('?')));
    const route_entry* found = nullptr;
    bool path_known = false;
    const auto& allowed = listener_.allowed;
    if (allowed.empty() || std::find(allowed.begin(), allowed.end(), path) != allowed.end())
      for (const route_entry& r : srv_.routes)
        if (r.path == path) {
          path_known = true;
          if (beast::iequals(r.method, std::string_view(req.method_string().data(),
                                                        req.method_string().size())))
            found = &r;
        }
    ++seq_;
    phase_ = phase::handling;
    // Alive while the handler holds the reply (no operation of its own may be pending: the
    // watcher stops when a pipelined request is waiting); let go when the response ends.
    hold();
    watch();
    auto rep =
        std::make_shared<reply_impl<Stream>>(this->weak_from_this(), seq_, stream_.get_executor());
    if (found == nullptr) {
      if (path_known)
        rep->send(405, "application/json", error_body("method not allowed", "method_not_allowed"),
                  {});
      else
        rep->send(404, "application/json", error_body("no such endpoint", "not_found"), {});
      return;
    }
    request r;
    r.method = std::string(req.method_string());
    r.target = std::string(target);
    r.peer = peer_;
    r.listener = listener_.name;
    for (const auto& f : req)
      r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    r.body = std::move(req.body());
    parser_.reset();
    const handler& h = found->h;
    auto run = [h, r = std::move(r), rep]() {
      try {
        h(r, rep);
      } catch (const std::exception&) {
        rep->send(500, "application/json", error_body("internal error", "server_error"), {});
      }
    };
    if (found->offload)
      net::post(srv_.workers, std::move(run));
    else
      run();
  }

  /// Watches the socket while the request is handled: a client that closes its end is seen
  /// at once (recv of 0 bytes), whether or not anything is being written to it.
  void watch() {
    if (watching_ && watch_seq_ == seq_) return;
    watching_ = true;
    watch_seq_ = seq_;
    lowest().socket().async_wait(tcp::socket::wait_read, [self = this->shared_from_this(),
                                                          seq = seq_](const error_code& ec) {
      // (A wait cancelled at the end of an earlier response completes late: it must not clear
      // the flag of the wait that watches the request after it.)
      if (seq == self->watch_seq_) self->watching_ = false;
      if (ec || seq != self->seq_ ||
          (self->phase_ != phase::handling && self->phase_ != phase::streaming &&
           self->phase_ != phase::writing))
        return;
      char b = 0;
      const ssize_t n =
          ::recv(self->lowest().socket().native_handle(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        return self->gone();
      if (n < 0) return self->watch();
      // Bytes: a pipelined request (or a TLS record), read after this response.
    });
  }

  void pump() {
    if (phase_ != phase::streaming || writing_) return;
    auto [bytes, end] = pull_();
    if (bytes.empty()) {
      if (end) write_last();
      return;
    }
    chunk_ = std::move(bytes);
    writing_ = true;
    lowest().expires_after(srv_.lim.write_timeout);
    net::async_write(
        stream_, bhttp::make_chunk(net::buffer(chunk_)),
        [self = this->shared_from_this(), end = end](const error_code& ec, std::size_t) {
          self->writing_ = false;
          if (ec) return self->gone();
          if (end) return self->write_last();
          self->pump();
        });
  }
  void write_last() {
    writing_ = true;
    lowest().expires_after(srv_.lim.write_timeout);
    net::async_write(stream_, bhttp::make_chunk_last(),
                     [self = this->shared_from_this()](const error_code& ec, std::size_t) {
                       self->writing_ = false;
                       if (ec) return self->gone();
                       self->response_done(self->head_->keep_alive());
                     });
  }

  void response_done(bool keep) {
    responded_whole_ = true;
    const auto self = let_go();
    pull_ = {};
    head_sr_.reset();
    head_.reset();
    on_gone_ = {};
    if (watching_) {
      error_code ignored;
      lowest().socket().cancel(ignored);  // nothing else is pending: the response is written
    }
    if (!keep) return linger_close();
    read_request();
  }

  /// The server stops: what this session holds of itself and of its handler goes (called
  /// after the I/O thread has ended; nothing else runs on the session then).
  void abandon() {
    phase_ = phase::closed;
    on_gone_ = {};
    pull_ = {};
    (void)let_go();
  }

  /// The client went away (closed, reset, or stopped reading) before the response ended.
  void gone() {
    if (phase_ == phase::closed) return;
    const auto self = let_go();
    srv_.count(&counters::disconnects);
    phase_ = phase::closed;
    if (auto f = std::move(on_gone_)) f();
    on_gone_ = {};
    pull_ = {};
    error_code ignored;
    lowest().socket().close(ignored);
  }

  /// A refusal before the request was read whole: the answer, then the connection closes.
  /// What the client still sends is read and dropped (held nowhere) for up to 5 s and 64 MiB,
  /// as nginx's lingering close does: a client that writes its whole body before it reads
  /// (most do: few send Expect: 100-continue) then gets the answer instead of a reset.
  void refuse(int status, const char* message, const char* code) {
    phase_ = phase::writing;
    keep_alive_ = false;
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(
        static_cast<bhttp::status>(status), version_ ? version_ : 11);
    res->set(bhttp::field::server, "relokv");
    res->set(bhttp::field::content_type, "application/json");
    if (status == 503) res->set(bhttp::field::retry_after, "1");
    res->body() = error_body(message, code);
    res->keep_alive(false);
    res->prepare_payload();
    lowest().expires_after(srv_.lim.write_timeout);
    bhttp::async_write(stream_, *res,
                       [self = this->shared_from_this(), res](const error_code& ec, std::size_t) {
                         if (ec) return self->close();
                         self->linger_close();
                       });
  }

  void linger_close() {
    phase_ = phase::closed;
    error_code ignored;
    lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    lowest().expires_after(
        std::min<std::chrono::milliseconds>(srv_.lim.request_timeout, std::chrono::seconds(5)));
    drain_left_ = std::size_t{64} << 20;
    drain();
  }
  void drain() {
    lowest().async_read_some(net::buffer(scratch_), [self = this->shared_from_this()](
                                                        const error_code& ec, std::size_t n) {
      if (ec || n >= self->drain_left_) return self->close();
      self->drain_left_ -= n;
      self->drain();
    });
  }
  void close() {
    phase_ = phase::closed;
    (void)let_go();
    error_code ignored;
    lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    lowest().socket().close(ignored);
  }

  server::impl& srv_;
  server::impl::listener& listener_;
  Stream stream_;
  std::string peer_;
  beast::flat_buffer buf_;  // bounded by the parser's header and body limits
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  unsigned version_ = 11;
  bool first_ = true, keep_alive_ = true, watching_ = false, writing_ = false;
  bool responded_whole_ = false;
  phase phase_ = phase::reading;
  std::uint64_t seq_ = 0, watch_seq_ = 0, id_ = 0;
  std::chrono::steady_clock::time_point deadline_{};  // of the request being read
  std::shared_ptr<session> hold_;  // while a handler answers (dispatch to response_done)
  // The session holds itself while it answers, and is counted as answering (a drain waits
  // for the count to reach 0 before the I/O stops: the last chunk is written, not cut).
  void hold() {
    if (!hold_) ++srv_.answering;
    hold_ = this->shared_from_this();
  }
  std::shared_ptr<session> let_go() {
    if (hold_) --srv_.answering;
    return std::move(hold_);
  }
  std::function<void()> on_gone_;
  std::function<std::pair<std::string, bool>()> pull_;
  std::optional<bhttp::response<bhttp::empty_body>> head_;
  std::optional<bhttp::response_serializer<bhttp::empty_body>> head_sr_;
  std::string chunk_;
  std::size_t drain_left_ = 0;
  char scratch_[4096];
};

}  // namespace detail

}  // namespace relokv_server::http
