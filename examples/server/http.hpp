#pragma once
// relokv_server's HTTP layer: Boost.Beast over Asio, every limit enforced on every path.
//
// One I/O thread serves every connection asynchronously: an idle, slow or half-open client
// holds a socket and a few hundred bytes, never a thread, so it cannot delay another client's
// /health or answer. Handlers that compute (parsing, tokenizing) run on a small worker pool;
// a response is sent from any thread through `reply`, which posts to the connection.
//
// Limits (each a relokv_server flag, docs/server.md): connections in all and per client
// address (more are closed at accept); header bytes (431) and fields (431); body bytes
// whatever the framing (Content-Length over the limit: 413 before a byte of the body is read;
// chunked or until-close bodies: 413 as the limit is passed); one deadline for a request's
// whole arrival, headers and body (a slow drip is cut off); compressed bodies refused (415:
// nothing is inflated); no Range (a response is always whole); writes that a client does not
// read time out. Why Beast: Debian 12's cpp-httplib (0.11.4) checks the body limit against
// Content-Length only, holds a thread per connection and inflates gzip bodies before any
// check; Beast's parser applies body_limit and header_limit to every framing and its
// tcp_stream gives per-operation deadlines.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace relokv_server::http {

struct limits {
  std::size_t max_connections = 512;                 ///< open connections in all
  std::size_t max_connections_per_client = 64;       ///< from one client address
  std::uint32_t max_header_bytes = 16 * 1024;        ///< the request line and headers
  std::size_t max_header_fields = 64;                ///< header lines
  std::uint64_t max_body_bytes = 1 << 20;            ///< whatever the framing
  std::chrono::milliseconds request_timeout{15000};  ///< a request's whole arrival
  std::chrono::milliseconds idle_timeout{30000};     ///< keep-alive wait for the next one
  std::chrono::milliseconds write_timeout{30000};    ///< one write to a client
};

using header_list = std::vector<std::pair<std::string, std::string>>;

/// A request, read whole within the limits.
struct request {
  std::string method, target, body;
  std::string peer;      ///< the client's address
  std::string listener;  ///< the name of the listener it came on (listen()'s `name`)
  header_list headers;
  /// A header's value ("" when absent); names compare case-insensitively.
  [[nodiscard]] std::string header(std::string_view name) const;
};

/// How a handler answers its request. Any thread may call it; the calls run in order on the
/// connection's own strand, and anything after the response ended (or after the client left)
/// is ignored.
class reply {
 public:
  virtual ~reply() = default;
  /// A whole response.
  virtual void send(int status, std::string content_type, std::string body,
                    header_list extra = {}) = 0;
  /// A streamed response (chunked): `pull` runs on the connection's strand, after each
  /// notify() once the previous write is done, and returns the bytes to send now (may be
  /// empty) and whether the response ends with them.
  virtual void stream(int status, std::string content_type, header_list extra,
                      std::function<std::pair<std::string, bool>()> pull) = 0;
  /// Something new for a stream's pull.
  virtual void notify() = 0;
  /// `f` runs on the connection's strand while this request is the connection's current one
  /// (never after the client left or the connection moved on): where a handler whose answer
  /// another thread computed builds and sends it.
  virtual void post(std::function<void()> f) = 0;
  /// `f` runs once, on the strand, when the client goes away before the response ends (it
  /// closed the connection, or stopped reading past the write timeout). Set it before the
  /// work it cancels can take long.
  virtual void on_disconnect(std::function<void()> f) = 0;
};

using handler = std::function<void(const request&, std::shared_ptr<reply>)>;

/// What the layer counts (for /metrics): refusals by reason, connections open.
struct counters {
  std::int64_t connections_open = 0, connections_refused = 0;
  std::int64_t header_too_large = 0, body_too_large = 0, encoding_refused = 0, timeouts = 0;
  std::int64_t disconnects = 0;
};

/// TLS material (HTTPS): PEM files, as llama-server takes them.
struct tls_files {
  std::string cert_file, key_file;
  [[nodiscard]] bool enabled() const noexcept { return !cert_file.empty(); }
};

class server {
 public:
  /// `workers`: threads that run the handlers registered with offload.
  explicit server(limits l, int workers = 2);
  ~server();
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// A route: exact method and path (the query string is ignored). `offload`: the handler
  /// computes and runs on a worker; otherwise on the I/O thread (it must not block).
  void route(std::string method, std::string path, handler h, bool offload = false);
  /// Listens on host:port (0: any free port); returns the port. `tls`: HTTPS on this one.
  /// `routes_allowed`: only these paths are served on this listener (empty: every route);
  /// `name`: what its requests carry as request::listener.
  /// @throws std::runtime_error when it cannot listen, or the TLS files do not load
  int listen(const std::string& host, int port, const tls_files& tls = {},
             std::vector<std::string> routes_allowed = {}, std::string name = {});
  /// Serves on the I/O thread until stop().
  void start();
  /// Stops accepting; requests that arrive on open connections are answered 503 with
  /// Connection: close. Responses under way go on.
  void drain();
  /// Closes everything and joins the threads. Idempotent.
  void stop();
  [[nodiscard]] counters stats() const;
  /// Responses begun and not yet written whole (nor given up: a client gone, a timeout): a
  /// drain waits for 0 before stop(), so that a finished answer's last bytes are sent.
  [[nodiscard]] int answering() const;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace relokv_server::http
