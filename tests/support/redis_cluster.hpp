#pragma once
// A real Redis Cluster for the tests: 3 masters and 3 replicas (redis-server --cluster-enabled
// yes on free loopback ports, joined by redis-cli --cluster create), a short node timeout so
// that a killed master's replica takes over in a few seconds; every node stopped at the end.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>

#include "support/redis_server.hpp"

namespace relokv_test {

class redis_cluster {
 public:
  explicit redis_cluster(int masters = 3, int node_timeout_ms = 1000) {
    // Three tries, each on fresh ports and bounded in time: `redis-cli --cluster create` waits
    // for the nodes to agree without a limit of its own.
    std::string why;
    for (int attempt = 1; attempt <= 3; ++attempt) {
      try {
        create(masters, node_timeout_ms);
        return;
      } catch (const std::exception& e) {
        why = e.what();
        std::fprintf(stderr, "redis_cluster: try %d failed: %s\n", attempt, why.c_str());
        nodes_.clear();
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
      }
    }
    throw std::runtime_error("no Redis Cluster after three tries: " + why);
  }
  ~redis_cluster() {
    nodes_.clear();  // each stopped
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  redis_cluster(const redis_cluster&) = delete;
  redis_cluster& operator=(const redis_cluster&) = delete;

  /// redis-cluster://127.0.0.1:P1,127.0.0.1:P2 (two seeds: one may be down).
  [[nodiscard]] std::string url(const std::string& userinfo = {},
                                const std::string& query = {}) const {
    return "redis-cluster://" + (userinfo.empty() ? "" : userinfo + "@") +
           "127.0.0.1:" + std::to_string(nodes_[0]->port()) +
           ",127.0.0.1:" + std::to_string(nodes_[1]->port()) + (query.empty() ? "" : "?" + query);
  }
  [[nodiscard]] std::vector<std::unique_ptr<redis_server>>& nodes() { return nodes_; }
  /// The node listening on `port`.
  redis_server& at(int port) {
    for (auto& n : nodes_)
      if (n->port() == port) return *n;
    throw std::runtime_error("no node on port " + std::to_string(port));
  }
  /// The port of the master that serves `slot`, asked of a live node (-1 when none says).
  int master_of(int slot) const {
    for (const auto& n : nodes_) {
      redisReply* r = n->command({"CLUSTER", "SLOTS"});
      if (r == nullptr) continue;
      int port = -1;
      if (r->type == REDIS_REPLY_ARRAY)
        for (std::size_t i = 0; i < r->elements; ++i) {
          const redisReply* e = r->element[i];
          if (e->element[0]->integer <= slot && slot <= e->element[1]->integer)
            port = static_cast<int>(e->element[2]->element[1]->integer);
        }
      freeReplyObject(r);
      if (port > 0) return port;
    }
    return -1;
  }
  /// Runs a command on every node that is up (ACL users: the cluster does not propagate them).
  void on_every_node(const std::vector<std::string>& args) {
    for (auto& n : nodes_)
      if (n->ping() && !n->run(args)) throw std::runtime_error("a node refused " + args[0]);
  }
  /// Waits until every live node says cluster_state:ok and knows all slots, and node 0's map
  /// has a replica for every master (a test that kills a master waits for no replica).
  void wait_ok(std::chrono::milliseconds limit) const {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      bool all = true;
      for (const auto& n : nodes_) {
        if (!n->ping()) continue;
        redisReply* r = n->command({"CLUSTER", "INFO"});
        const bool ok =
            r != nullptr && r->type == REDIS_REPLY_STRING &&
            std::string(r->str, r->len).find("cluster_state:ok") != std::string::npos &&
            std::string(r->str, r->len).find("cluster_slots_ok:16384") != std::string::npos;
        if (r) freeReplyObject(r);
        all = all && ok;
      }
      // And every master's replica is in the slot map (replicas attach after the create).
      if (redisReply* r = nodes_[0]->command({"CLUSTER", "SLOTS"}); r != nullptr) {
        if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) all = false;
        for (std::size_t i = 0; all && i < r->elements; ++i) all = r->element[i]->elements >= 4;
        freeReplyObject(r);
      }
      if (all) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    throw std::runtime_error("the cluster did not reach cluster_state:ok");
  }

 private:
  void create(int masters, int node_timeout_ms) {
    const auto t0 = std::chrono::steady_clock::now();
    dir_ = std::filesystem::temp_directory_path() /
           ("relokv-cluster-" + std::to_string(::getpid()) + "-" + std::to_string(++count()));
    std::filesystem::create_directories(dir_);
    for (int i = 0; i < 2 * masters; ++i)
      nodes_.push_back(std::make_unique<redis_server>(std::vector<std::string>{
          "--cluster-enabled", "yes", "--cluster-config-file", "nodes-{port}.conf",
          "--cluster-node-timeout", std::to_string(node_timeout_ms), "--dir", dir_.string(),
          // A cache's cluster serves the slots it has while a master's are being taken over
          // (docs/store.md): without this every node refuses every key meanwhile.
          "--cluster-require-full-coverage", "no"}));
    const std::string log = (dir_ / "create.log").string();
    std::string cmd = "timeout 60 redis-cli --cluster create";
    for (const auto& n : nodes_) cmd += " 127.0.0.1:" + std::to_string(n->port());
    cmd += " --cluster-replicas 1 --cluster-yes >" + log + " 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      std::string tail;
      if (std::FILE* f = std::fopen(log.c_str(), "r")) {
        char buf[4096];
        const std::size_t n = std::fread(buf, 1, sizeof buf, f);
        std::fclose(f);
        tail.assign(buf, n);
      }
      throw std::runtime_error("redis-cli --cluster create failed or took over 60 s: " + tail);
    }
    wait_ok(std::chrono::seconds(30));
    // On stderr: relokv_report's stdout holds `name value` lines only.
    std::fprintf(stderr, "redis_cluster: %d nodes on ports", 2 * masters);
    for (const auto& n : nodes_) std::fprintf(stderr, " %d", n->port());
    std::fprintf(stderr, ", ready after %.1f s\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  static int& count() {
    static int n = 0;
    return n;
  }
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<redis_server>> nodes_;
};

}  // namespace relokv_test
