#pragma once
// A real redis-server for the tests: started on a free loopback port with no persistence,
// killed (SIGKILL, as a crash) or stopped, and restarted on the same port. Tests that need it
// exit 77 (skipped) when redis-server is not installed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>

namespace relokv_test {

/// The redis-server binary on PATH, or empty.
inline std::string find_redis_server() {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/usr/sbin:/bin";
  std::size_t start = 0;
  while (start <= p.size()) {
    const std::size_t end = p.find(':', start);
    const std::string dir = p.substr(start, end == std::string::npos ? end : end - start);
    const std::string cand = dir + "/redis-server";
    if (!dir.empty() && ::access(cand.c_str(), X_OK) == 0) return cand;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  for (const char* c : {"/usr/bin/redis-server", "/usr/sbin/redis-server"})
    if (::access(c, X_OK) == 0) return c;
  return {};
}

class redis_server {
 public:
  explicit redis_server(std::vector<std::string> extra = {})
      : bin_(find_redis_server()), extra_(std::move(extra)) {
    // A cluster node also listens on its port + 10000 (the cluster bus). Both are drawn below
    // the kernel's ephemeral range (32768 and up on Linux), where no outgoing connection of a
    // concurrent test or of the other nodes can take either between this check and the bind.
    const bool cluster =
        std::find(extra_.begin(), extra_.end(), "--cluster-enabled") != extra_.end();
    if (cluster) {
      std::mt19937 draw(
          static_cast<unsigned>(::getpid()) * 2654435761u +
          static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
      std::uniform_int_distribution<int> pick(12000, 22767);
      port_ = 0;
      for (int tries = 0; tries < 1000 && port_ == 0; ++tries)
        if (const int p = pick(draw); port_free(p) && port_free(p + 10000)) port_ = p;
      if (port_ == 0) throw std::runtime_error("no free loopback port pair for a cluster node");
    } else {
      port_ = free_port();
    }
    start();
  }
  ~redis_server() { stop(); }
  redis_server(const redis_server&) = delete;
  redis_server& operator=(const redis_server&) = delete;

  [[nodiscard]] int port() const noexcept { return port_; }
  [[nodiscard]] std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  /// Starts the server and waits until it answers PING.
  void start() {
    if (pid_ > 0) return;
    const std::string port = std::to_string(port_);
    std::vector<std::string> args = {bin_,
                                     "--port",
                                     port,
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--enable-debug-command",
                                     "yes",
                                     "--dir",
                                     std::filesystem::temp_directory_path().string()};
    // "{port}" in an extra argument is this server's port (a cluster node's config file).
    for (std::string a : extra_) {
      if (const auto at = a.find("{port}"); at != std::string::npos) a.replace(at, 6, port);
      args.push_back(std::move(a));
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      // The server dies with the test that started it, even when that test is killed (a
      // timeout): no node outlives its run to gossip with the next run's nodes.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      const int devnull = ::open("/dev/null", O_WRONLY);
      if (devnull >= 0) {
        ::dup2(devnull, 1);
        ::dup2(devnull, 2);
      }
      ::execv(bin_.c_str(), argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 200; ++i) {
      if (ping()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    throw std::runtime_error("redis-server did not come up on port " + port);
  }
  /// Kills the server as a crash would (SIGKILL) and reaps it.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  /// Runs one command on a connection of its own; returns the reply (caller frees) or null.
  redisReply* command(const std::vector<std::string>& args) const {
    timeval tv{2, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    // A reply must come within 10 s too (MIGRATE's own limit is 5 s): a test waits on nothing
    // without a bound.
    if (c == nullptr || c->err || redisSetTimeout(c, timeval{10, 0}) != REDIS_OK) {
      if (c) redisFree(c);
      return nullptr;
    }
    std::vector<const char*> argv;
    std::vector<std::size_t> len;
    for (const auto& a : args) {
      argv.push_back(a.data());
      len.push_back(a.size());
    }
    void* r = redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), len.data());
    redisFree(c);
    return static_cast<redisReply*>(r);
  }
  /// Runs a command and returns true when it answered without an error.
  bool run(const std::vector<std::string>& args) const {
    redisReply* r = command(args);
    const bool ok = r != nullptr && r->type != REDIS_REPLY_ERROR;
    if (r) freeReplyObject(r);
    return ok;
  }
  bool ping() const { return run({"PING"}); }

 private:
  static bool port_free(int port) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    const bool ok = s >= 0 && ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (s >= 0) ::close(s);
    return ok;
  }
  static int free_port() {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t n = sizeof a;
    if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &n) != 0)
      throw std::runtime_error("no free loopback port");
    ::close(s);
    return ntohs(a.sin_port);
  }

  std::string bin_;
  std::vector<std::string> extra_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace relokv_test
