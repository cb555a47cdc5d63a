// relokv_server's HTTP layer alone (examples/server/http.hpp), with scripted handlers and raw
// sockets on loopback: many clients at once, answers from other threads, streams, clients
// that leave, limits, the drain. Runs under ASan+UBSan and ThreadSanitizer (label threads).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http.hpp"
#include "support/catch.hpp"

namespace http = relokv_server::http;
using namespace std::chrono_literals;

namespace {

/// A blocking loopback client socket.
class client {
 public:
  explicit client(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~client() { close(); }
  client(const client&) = delete;
  client& operator=(const client&) = delete;
  void send(const std::string& s) {
    std::size_t at = 0;
    while (at < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + at, s.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return;
      at += static_cast<std::size_t>(n);
    }
  }
  /// Reads until `n` bytes are buffered, the peer closes, or `limit` passes.
  void fill(std::size_t n, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (buf_.size() < n && !closed_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return;
      pollfd p{fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return;
      char b[4096];
      const ssize_t got = ::recv(fd_, b, sizeof b, MSG_DONTWAIT);
      if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (got <= 0) {
        closed_ = true;
        why_ = got == 0 ? "eof" : std::strerror(errno);
        return;
      }
      buf_.append(b, static_cast<std::size_t>(got));
    }
  }
  /// Reads until `until` appears in what was read, the peer closes, or `limit` passes.
  std::string read_until(const std::string& until, std::chrono::milliseconds limit = 5000ms) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (buf_.find(until) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      char b[4096];
      const ssize_t n = ::recv(fd_, b, sizeof b, MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n <= 0) {
        closed_ = true;
        break;
      }
      buf_.append(b, static_cast<std::size_t>(n));
    }
    const auto at = buf_.find(until);
    std::string out = at == std::string::npos ? buf_ : buf_.substr(0, at + until.size());
    buf_.erase(0, out.size());
    return out;
  }
  /// One whole response with a Content-Length body.
  std::string response() {
    std::string head = read_until("\r\n\r\n");
    const auto cl = head.find("Content-Length: ");
    if (cl == std::string::npos) return head;
    const std::size_t n = std::stoul(head.substr(cl + 16));
    fill(n, 5000ms);
    std::string body = buf_.substr(0, std::min(n, buf_.size()));
    buf_.erase(0, body.size());
    return head + body;
  }
  /// Reads until the peer closes (true) or `limit` passes (false).
  bool closed_by_peer(std::chrono::milliseconds limit = 3000ms) {
    fill(std::string::npos, limit);
    return closed_;
  }
  [[nodiscard]] const std::string& rest() const noexcept { return buf_; }
  [[nodiscard]] const std::string& why() const noexcept { return why_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
  std::string buf_;
  bool closed_ = false;
  std::string why_;
};

int status_of(const std::string& r) {
  return r.size() > 12 && r.starts_with("HTTP/1.1 ") ? std::stoi(r.substr(9, 3)) : 0;
}

std::string get(const std::string& path, const std::string& extra = {}) {
  return "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + extra + "\r\n";
}

std::string post(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

/// A server with the routes the tests drive.
struct fixture {
  http::limits lim;
  std::unique_ptr<http::server> srv;
  int port = 0;
  std::atomic<int> gone{0};
  std::mutex mu;
  std::vector<std::shared_ptr<http::reply>> parked;  // answered by nobody until released
  std::vector<std::thread> answerers;

  explicit fixture(http::limits l = {}) : lim(l) {
    srv = std::make_unique<http::server>(lim);
    srv->route("GET", "/health", [](const http::request&, std::shared_ptr<http::reply> r) {
      r->send(200, "text/plain", "ok", {});
    });
    // The body's length, from a worker.
    srv->route(
        "POST", "/echo",
        [](const http::request& q, std::shared_ptr<http::reply> r) {
          r->send(200, "text/plain", std::to_string(q.body.size()) + ":" + q.body, {});
        },
        /*offload=*/true);
    // Answered later, from another thread.
    srv->route("GET", "/later", [this](const http::request&, std::shared_ptr<http::reply> r) {
      const std::lock_guard lock(mu);
      answerers.emplace_back([r] {
        std::this_thread::sleep_for(50ms);
        r->send(200, "text/plain", "later", {});
      });
    });
    // Never answered: only the client's leaving ends it.
    srv->route("GET", "/park", [this](const http::request&, std::shared_ptr<http::reply> r) {
      r->on_disconnect([this] { ++gone; });
      const std::lock_guard lock(mu);
      parked.push_back(r);
    });
    // Five pieces, pushed from another thread, pulled in order.
    srv->route("GET", "/stream", [this](const http::request&, std::shared_ptr<http::reply> r) {
      auto n = std::make_shared<std::atomic<int>>(0);
      auto sent = std::make_shared<int>(0);
      r->stream(200, "text/plain", {}, [n, sent]() -> std::pair<std::string, bool> {
        std::string out;
        for (; *sent < n->load(); ++*sent) out += "piece" + std::to_string(*sent) + ";";
        return {out, *sent == 5};
      });
      const std::lock_guard lock(mu);
      answerers.emplace_back([r, n] {
        for (int i = 0; i < 5; ++i) {
          std::this_thread::sleep_for(10ms);
          ++*n;
          r->notify();
        }
      });
    });
    port = srv->listen("127.0.0.1", 0);
    srv->start();
  }
  ~fixture() {
    srv->stop();
    for (auto& t : answerers) t.join();
  }
};

}  // namespace

TEST_CASE("http: many clients at once, kept alive, each answer whole and its own",
          "[server][threads]") {
  fixture f;
  std::vector<std::thread> users;
  std::atomic<int> ok{0};
  for (int u = 0; u < 8; ++u)
    users.emplace_back([&, u] {
      client c(f.port);
      for (int i = 0; i < 20; ++i) {
        const std::string body = "user" + std::to_string(u) + "-" + std::to_string(i);
        c.send(i % 3 == 0 ? get("/health") : i % 3 == 1 ? post("/echo", body) : get("/later"));
        const std::string r = c.response();
        const std::string want = i % 3 == 0   ? "ok"
                                 : i % 3 == 1 ? std::to_string(body.size()) + ":" + body
                                              : "later";
        if (status_of(r) == 200 && r.ends_with(want)) ++ok;
      }
    });
  for (auto& t : users) t.join();
  CHECK(ok == 160);
  CHECK(f.srv->stats().connections_open >= 0);
}

TEST_CASE("http: a stream pulls each piece once, in order, then ends", "[server][threads]") {
  fixture f;
  client c(f.port);
  c.send(get("/stream"));
  const std::string r = c.read_until("0\r\n\r\n");
  CHECK(status_of(r) == 200);
  CHECK(r.find("Transfer-Encoding: chunked") != std::string::npos);
  std::string text;
  for (std::size_t at = r.find("piece"); at != std::string::npos; at = r.find("piece", at + 1))
    text += r.substr(at, 7);
  CHECK(text == "piece0;piece1;piece2;piece3;piece4;");
  // The connection is kept: the next request is answered on it.
  c.send(get("/health"));
  CHECK(c.response().ends_with("ok"));
}

TEST_CASE("http: answering() counts responses begun and not ended (what a drain waits for)",
          "[server][threads]") {
  fixture f;
  // Reaches 0 (or `want`) within a second: the counter moves on the I/O thread.
  const auto settles = [&](int want) {
    const auto end = std::chrono::steady_clock::now() + 1000ms;
    while (f.srv->answering() != want && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(1ms);
    return f.srv->answering() == want;
  };
  CHECK(f.srv->answering() == 0);
  {
    client idle(f.port);  // connected, no request: nothing is being answered
    client parked(f.port);
    parked.send(get("/park"));
    CHECK(settles(1));
    client streamed(f.port);
    streamed.send(get("/stream"));
    // The stream is counted until its last chunk is written, then no longer.
    const std::string r = streamed.read_until("0\r\n\r\n");
    CHECK(r.find("piece4;") != std::string::npos);
    CHECK(settles(1));  // the parked one is still answering
    parked.close();     // its client leaves: given up, no longer counted
    CHECK(settles(0));
    idle.send(get("/health"));
    CHECK(idle.response().ends_with("ok"));
    CHECK(settles(0));
  }
  CHECK(settles(0));
}

TEST_CASE("http: a client that leaves while its answer is pending is seen at once",
          "[server][threads]") {
  fixture f;
  {
    client c(f.port);
    c.send(get("/park"));
    std::this_thread::sleep_for(100ms);
  }  // closed
  const auto t0 = std::chrono::steady_clock::now();
  while (f.gone == 0 && std::chrono::steady_clock::now() - t0 < 2s)
    std::this_thread::sleep_for(1ms);
  CHECK(f.gone == 1);
  CHECK(std::chrono::steady_clock::now() - t0 < 200ms);
  CHECK(f.srv->stats().disconnects == 1);
  // The same on a kept-alive connection's later request (its watcher is a new one).
  {
    client c(f.port);
    c.send(get("/health"));
    CHECK(c.response().ends_with("ok"));
    c.send(get("/later"));
    CHECK(c.response().ends_with("later"));
    c.send(get("/park"));
    std::this_thread::sleep_for(100ms);
  }
  const auto t1 = std::chrono::steady_clock::now();
  while (f.gone == 1 && std::chrono::steady_clock::now() - t1 < 2s)
    std::this_thread::sleep_for(1ms);
  CHECK(f.gone == 2);
  CHECK(std::chrono::steady_clock::now() - t1 < 200ms);
  // A reply sent after the client left is dropped, and the server goes on.
  f.parked.front()->send(200, "text/plain", "too late", {});
  client d(f.port);
  d.send(get("/health"));
  CHECK(d.response().ends_with("ok"));
}

TEST_CASE("http: limits on headers, bodies, encodings and arrival", "[server][threads]") {
  http::limits l;
  l.max_body_bytes = 100;
  l.max_header_bytes = 2048;
  l.max_header_fields = 8;
  l.request_timeout = 300ms;
  fixture f(l);
  SECTION("a body one byte over, declared") {
    client c(f.port);
    c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n");
    CHECK(status_of(c.response()) == 413);
  }
  SECTION("a chunked body one byte over") {
    client c(f.port);
    c.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n65\r\n" +
           std::string(101, 'a') + "\r\n0\r\n\r\n");
    CHECK(status_of(c.response()) == 413);
  }
  SECTION("a body at the limit") {
    client c(f.port);
    c.send(post("/echo", std::string(100, 'a')));
    CHECK(status_of(c.response()) == 200);
  }
  SECTION("too many fields, too many bytes") {
    client c(f.port);
    std::string h;
    for (int i = 0; i < 9; ++i) h += "X-" + std::to_string(i) + ": 1\r\n";
    c.send(get("/health", h));
    CHECK(status_of(c.response()) == 431);
    client d(f.port);
    d.send(get("/health", "X-Pad: " + std::string(4096, 'a') + "\r\n"));
    CHECK(status_of(d.response()) == 431);
  }
  SECTION("a compressed body") {
    client c(f.port);
    c.send(
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\nab");
    CHECK(status_of(c.response()) == 415);
  }
  SECTION("half a request, then silence: closed at the deadline") {
    client c(f.port);
    c.send("GET /health HTTP/1.1\r\nHo");
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(c.closed_by_peer());
    CHECK(std::chrono::steady_clock::now() - t0 < 1000ms);
    INFO("received: " << c.rest() << " (" << c.why() << ")");
    CHECK(c.rest().empty());
    // Counted as the read ends (Beast closes the socket as its timer fires, a moment before).
    const auto t1 = std::chrono::steady_clock::now();
    while (f.srv->stats().timeouts == 0 && std::chrono::steady_clock::now() - t1 < 1s)
      std::this_thread::sleep_for(1ms);
    CHECK(f.srv->stats().timeouts >= 1);
  }
  SECTION("no such route, or not this method") {
    client c(f.port);
    c.send(get("/nothing"));
    CHECK(status_of(c.response()) == 404);
    c.send(get("/echo"));
    CHECK(status_of(c.response()) == 405);
  }
}

TEST_CASE("http: connections past the caps are closed; the drain answers 503",
          "[server][threads]") {
  http::limits l;
  l.max_connections_per_client = 3;
  fixture f(l);
  std::vector<std::unique_ptr<client>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<client>(f.port));
    held.back()->send(get("/health"));
    CHECK(held.back()->response().ends_with("ok"));
  }
  client over(f.port);
  CHECK(over.closed_by_peer());
  CHECK(f.srv->stats().connections_refused == 1);
  f.srv->drain();
  held[0]->send(get("/health"));
  const std::string r = held[0]->response();
  CHECK(status_of(r) == 503);
  CHECK(r.find("Connection: close") != std::string::npos);
}
