#pragma once
// A scripted Redis peer for the fault tests of the Redis stores: a loopback listener that runs a
// script on each connection (a server that drips bytes, lies about lengths, redirects forever).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <relokv/store/redis_store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "support/catch.hpp"

namespace relokv_test {

/// A scripted Redis peer on a loopback port (written here, started and stopped by the test):
/// it accepts connections one at a time and runs `script` on each socket.
class scripted_peer {
 public:
  explicit scripted_peer(std::function<void(int)> script) : script_(std::move(script)) {
    ls_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(ls_ >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    REQUIRE(::bind(ls_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(ls_, 4) == 0);
    REQUIRE(::getsockname(ls_, reinterpret_cast<sockaddr*>(&a), &alen) == 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{ls_, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        const int c = ::accept(ls_, nullptr, nullptr);
        if (c < 0) continue;
        script_(c);
        ::close(c);
      }
    });
  }
  ~scripted_peer() {
    stop_ = true;
    thread_.join();
    ::close(ls_);
  }
  scripted_peer(const scripted_peer&) = delete;
  scripted_peer& operator=(const scripted_peer&) = delete;
  [[nodiscard]] int port() const noexcept { return port_; }
  [[nodiscard]] relokv::redis_store_options options(std::chrono::milliseconds deadline) const {
    relokv::redis_store_options o;
    o.host = "127.0.0.1";
    o.port = port_;
    o.command_timeout = deadline;
    return o;
  }

  /// Reads what the client sent until it has been quiet for 100 ms.
  static void drain(int c) {
    char buf[65536];
    pollfd p{c, POLLIN, 0};
    while (::poll(&p, 1, 100) > 0 && ::read(c, buf, sizeof buf) > 0) {
    }
  }
  /// Sends all of `s` (false once the client is gone; never SIGPIPE).
  static bool send_all(int c, const std::string& s) {
    std::size_t off = 0;
    while (off < s.size()) {
      const ssize_t w = ::send(c, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (w <= 0) return false;
      off += static_cast<std::size_t>(w);
    }
    return true;
  }

 private:
  std::function<void(int)> script_;
  int ls_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace relokv_test
