#pragma once
// Redis Cluster figures (redis_cluster_store on a 3-master, 3-replica cluster started here on
// loopback ports, and one redis-server beside it; all stopped after):
//  - store_cluster_get_gb_s: redis_cluster_store::get of the 64 SmolLM2-sized blocks of
//    store_sample (each decoded and checked), spread over the three masters;
//  - store_cluster_over_single: that fetch's rate over redis_store::get of the same bytes from
//    one server, side by side in this run (goal >= 0.8; on a 2-core machine the three masters,
//    the single server and the client share the cores);
//  - store_cluster_round_trips_per_plan: the pipelines (one round trip each, all at once) one
//    plan's fetch sends, mean over the QA sample's questions (10 passages each, blocks of 16
//    tokens, a passage's tokens estimated as 1.3 per word), every block under its own key;
//    store_cluster_sequential_rounds_per_plan: the rounds one after another (1 without
//    redirects);
//  - store_cluster_placement_*: the two placements side by side on the same plans: every
//    block by its own key (`per_key`, what the store does) or a span's blocks kept together by
//    a hash tag (`per_span`): nodes per plan, the busiest node's share of all blocks fetched
//    (1/3 is even), and the blocks the busiest node of a plan serves (the plan waits for it);
//  - store_cluster_failover_wrong_blocks (goal 0) and store_cluster_failover_miss_seconds: a
//    master killed (SIGKILL) under a reader that fetches 240 blocks every 50 ms: wrong blocks
//    served meanwhile, and how long the killed master's keys were misses before its replica
//    served them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <relokv/store/redis_cluster_store.hpp>
#include <relokv/store/redis_store.hpp>

#include "support/measure.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#include "support/store_figures.hpp"

namespace relokv_bench {

/// One question's plan: for each of its passages, the passage's name and its block count.
using qa_plan = std::vector<std::pair<std::string, int>>;

/// The QA sample's plans (data/2wikimqa_dev_sample200.jsonl): blocks of 16 tokens, a
/// passage's tokens estimated as 1.3 per word (its title and sentences).
inline std::vector<qa_plan> qa_plans(const std::string& path) {
  std::vector<qa_plan> plans;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("context")) continue;
    qa_plan p;
    for (const auto& ctx : j["context"]) {
      const std::string title = ctx[0].get<std::string>();
      std::size_t words = 0;
      std::string text = title;
      for (const auto& s : ctx[1]) {
        text += ' ';
        text += s.get<std::string>();
      }
      std::istringstream ws(text);
      for (std::string w; ws >> w;) ++words;
      const int tokens = static_cast<int>(std::ceil(1.3 * double(words)));
      p.emplace_back(title, std::max(1, (tokens + 15) / 16));
    }
    plans.push_back(std::move(p));
  }
  return plans;
}

inline std::vector<std::pair<std::string, double>> cluster_figures(int reps,
                                                                   const std::string& qa_path) {
  std::vector<std::pair<std::string, double>> out;
  reps = std::max(reps, 3);
  using namespace std::chrono_literals;
  relokv_test::redis_cluster cluster;
  relokv_test::redis_server single;
  auto copt = relokv::redis_cluster_options::from_url(cluster.url());
  copt.command_timeout = 10000ms;
  relokv::redis_cluster_store cs(copt);
  auto sopt = relokv::redis_store_options::from_url(single.url());
  sopt.command_timeout = 10000ms;
  relokv::redis_store rs(sopt);

  // The fetch of 64 blocks: the cluster over one server.
  const store_sample s;
  const double gb = double(s.total_bytes()) / 1e9;
  const auto views = s.views();
  (void)cs.put(s.keys, views);
  (void)rs.put(s.keys, views);
  std::vector<relokv::store_blob> blobs;
  bool ok = true;
  const auto cluster_get = [&] {
    ok = ok && cs.get(s.keys, blobs) == relokv::store_status::kOk && s.check(blobs);
    blobs.clear();
  };
  const auto single_get = [&] {
    ok = ok && rs.get(s.keys, blobs) == relokv::store_status::kOk && s.check(blobs);
    blobs.clear();
  };
  cluster_get();
  single_get();
  out.emplace_back("store_cluster_get_gb_s", gb / (median_ns(cluster_get, reps, 1) * 1e-9));
  out.emplace_back("store_cluster_over_single",
                   1.0 / median_ratio(cluster_get, single_get, reps, 1));
  if (!ok) out.emplace_back("store_cluster_check_failed", 1);

  // The QA sample's plans: measured per key on the cluster; both placements counted.
  const auto plans = qa_plans(qa_path);
  if (!plans.empty()) {
    const auto pipelines = [&cs] {
      std::int64_t n = 0;
      for (const auto& x : cs.node_stats()) n += x.pipelines;
      return n;
    };
    const auto node_of = [&cs](int slot) { return cs.owner_of(slot); };
    std::map<std::string, std::int64_t> load_key, load_span;
    double nodes_key = 0, nodes_span = 0, busiest_key = 0, busiest_span = 0, rounds = 0;
    std::int64_t pipes = 0, total = 0;
    const std::vector<std::byte> value(1024, std::byte{7});
    for (const qa_plan& p : plans) {
      std::vector<relokv::store_key> keys;
      std::map<std::string, int> per_key, per_span;
      for (const auto& [title, blocks] : p) {
        const int span_slot = relokv::redis_cluster_slot(title);
        for (int b = 0; b < blocks; ++b) {
          relokv::store_key k{std::hash<std::string>{}(title) + static_cast<std::uint64_t>(b),
                              static_cast<std::uint64_t>(b)};
          keys.push_back(k);
          ++per_key[node_of(cs.slot_of(k))];
          ++per_span[node_of(span_slot)];
        }
      }
      const std::vector<std::span<const std::byte>> vals(keys.size(), value);
      (void)cs.put(keys, vals);
      const std::int64_t before = pipelines();
      const auto moved = cs.cluster_counters().moved + cs.cluster_counters().asked;
      (void)cs.get(keys, blobs);
      pipes += pipelines() - before;
      rounds += 1 + double(cs.cluster_counters().moved + cs.cluster_counters().asked - moved);
      total += static_cast<std::int64_t>(keys.size());
      nodes_key += double(per_key.size());
      nodes_span += double(per_span.size());
      int bk = 0, bs = 0;
      for (const auto& [n, c] : per_key) {
        load_key[n] += c;
        bk = std::max(bk, c);
      }
      for (const auto& [n, c] : per_span) {
        load_span[n] += c;
        bs = std::max(bs, c);
      }
      busiest_key += double(bk) / double(keys.size());
      busiest_span += double(bs) / double(keys.size());
    }
    const double np = double(plans.size());
    const auto share = [total](const std::map<std::string, std::int64_t>& m) {
      std::int64_t mx = 0;
      for (const auto& [n, c] : m) mx = std::max(mx, c);
      return double(mx) / double(std::max<std::int64_t>(total, 1));
    };
    out.emplace_back("store_cluster_round_trips_per_plan", double(pipes) / np);
    out.emplace_back("store_cluster_sequential_rounds_per_plan", rounds / np);
    out.emplace_back("store_cluster_placement_per_key_nodes_per_plan", nodes_key / np);
    out.emplace_back("store_cluster_placement_per_span_nodes_per_plan", nodes_span / np);
    out.emplace_back("store_cluster_placement_per_key_busiest_node_share", share(load_key));
    out.emplace_back("store_cluster_placement_per_span_busiest_node_share", share(load_span));
    out.emplace_back("store_cluster_placement_per_key_plan_busiest_fraction", busiest_key / np);
    out.emplace_back("store_cluster_placement_per_span_plan_busiest_fraction", busiest_span / np);
  }

  // Failover: a master killed under a reader.
  {
    auto fopt = relokv::redis_cluster_options::from_url(cluster.url());
    fopt.command_timeout = 500ms;
    fopt.retry_interval = 100ms;
    relokv::redis_cluster_store fs(fopt);
    std::vector<relokv::store_key> keys;
    std::vector<std::vector<std::byte>> vals;
    for (int k = 0; k < 240; ++k) {
      keys.push_back({static_cast<std::uint64_t>(k) * 0x9E3779B97F4A7C15ull + 3, 0xfa11});
      vals.emplace_back(2048, static_cast<std::byte>(k));
    }
    std::vector<std::span<const std::byte>> spans(vals.begin(), vals.end());
    (void)fs.put(keys, spans);
    std::this_thread::sleep_for(500ms);  // asynchronous replication: let the replicas catch up
    const int victim = cluster.master_of(fs.slot_of(keys[0]));
    cluster.at(victim).kill();
    const auto t0 = std::chrono::steady_clock::now();
    double back = -1;
    std::int64_t wrong = 0;
    while (std::chrono::steady_clock::now() - t0 < 30s) {
      (void)fs.get(keys, blobs);
      int hits = 0;
      for (std::size_t k = 0; k < keys.size(); ++k) {
        if (blobs[k].empty()) continue;
        ++hits;
        const auto b = blobs[k].bytes();
        if (b.size() != vals[k].size() || !std::equal(b.begin(), b.end(), vals[k].begin())) ++wrong;
      }
      if (hits == static_cast<int>(keys.size())) {
        back = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        break;
      }
      std::this_thread::sleep_for(50ms);
    }
    out.emplace_back("store_cluster_failover_wrong_blocks", double(wrong));
    out.emplace_back("store_cluster_failover_miss_seconds", back);
  }
  return out;
}

}  // namespace relokv_bench
