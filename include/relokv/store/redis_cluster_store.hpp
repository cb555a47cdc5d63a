#pragma once
/// @file
/// A store on a Redis Cluster through hiredis, which has no cluster client: relokv speaks the
/// client's part of the cluster protocol itself (the Redis Cluster specification): each key's
/// hash slot by CRC16, the slot map from CLUSTER SLOTS, MOVED and ASK redirects. Link
/// `relokv::redis` (hiredis), as for redis_store; nothing else in relokv includes this header.
///
/// Each call sends one pipeline to every node it touches, all at once, and waits for them
/// together under one deadline (the connect timeout plus the command timeout, for connecting,
/// refreshing the map, every node and every redirect): a call costs the slowest node's time,
/// never the sum. A node that is down, slow
/// or gone mid-reply costs misses for its keys only; the other nodes' keys are answered in the
/// same call. MOVED updates the slot's owner and retries the key there within the deadline;
/// ASK sends ASKING and the command to the importing node, leaving the map as it is; after
/// max_redirects redirects a key is a miss (counted). A failure or a MOVED marks the map stale:
/// the next call refreshes it first, within its own deadline, at most once per retry interval.
/// Entries are content-addressed and whole, so whatever a node answers (a replica that lags, a
/// slot in migration) is the right block or a miss, never a wrong one.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <hiredis/hiredis.h>

#include "relokv/concepts/kv_store.hpp"
#include "relokv/store/detail/redis_link.hpp"
#include "relokv/store/redis_cluster_options.hpp"
#include "relokv/store/redis_store.hpp"
#include "relokv/store/store_url.hpp"

RELOKV_NAMESPACE_BEGIN

/// What one node of a cluster served: store_node_stats (concepts/kv_store.hpp).
using redis_cluster_node_stats = store_node_stats;

/// What the cluster client did beyond store_counters.
struct redis_cluster_counters {
  std::int64_t moved = 0, asked = 0;                 ///< redirects followed
  std::int64_t redirect_limit = 0;                   ///< keys given up after max_redirects (misses)
  std::int64_t unmapped = 0;                         ///< keys whose slot no node served (misses)
  std::int64_t refreshes = 0, refresh_failures = 0;  ///< slot map reloads
  std::int64_t node_failures = 0;  ///< a node's part of a call that failed (its keys missed)
};

class redis_cluster_store {
 public:
  /// Connects lazily: a cluster that is not up yet is an unavailable store, not an error.
  explicit redis_cluster_store(redis_cluster_options opt) : opt_(std::move(opt)) {
    if (opt_.seeds.empty()) throw error("redis_cluster_store: no seed node");
    if (opt_.key_prefix.empty())
      throw error("redis_cluster_store: the key prefix must not be empty");
    if (opt_.max_redirects < 0 || opt_.max_redirects > 64)
      throw error("redis_cluster_store: max_redirects must be in [0, 64]");
    for (const detail::redis_endpoint& e : opt_.seeds) {
      if (e.host.empty() || e.port <= 0 || e.port > 65535)
        throw error("redis_cluster_store: a seed needs a host and a port in [1, 65535]");
      (void)node_at(e);
    }
    owner_.assign(kRedisClusterSlots, -1);
  }
  redis_cluster_store(redis_cluster_store&&) noexcept = default;
  redis_cluster_store& operator=(redis_cluster_store&&) noexcept = default;

  store_status get(std::span<const store_key> keys, std::vector<store_blob>& out) {
    return get(keys, out, [](std::size_t, store_blob b) { return b; });
  }
  /// As get(keys, out), handing each entry found to `transform(i, blob)` as soon as its reply
  /// is in (sealed_store opens entries there); out[i] is what it returns.
  template <class Transform>
  store_status get(std::span<const store_key> keys, std::vector<store_blob>& out,
                   Transform&& transform) {
    ++c_.get_calls;
    c_.keys_requested += static_cast<std::int64_t>(keys.size());
    out.assign(keys.size(), store_blob{});
    if (keys.empty()) return store_status::kOk;
    return route("GET", keys, {}, opt_.read_from_replicas,
                 [&](std::size_t i, int node, redisReply* reply) {
                   // Found: counted for its node too. A miss, another tenant's key (denied) or an
                   // error reply (CLUSTERDOWN, TRYAGAIN, LOADING): a miss for this key alone.
                   if (detail::redis_take_get(reply, i, out, transform, c_) ==
                       detail::redis_get_reply::kFound)
                     ++nodes_[static_cast<std::size_t>(node)].stats.keys_read;
                   return true;
                 });
  }

  store_status put(std::span<const store_key> keys,
                   std::span<const std::span<const std::byte>> values) {
    ++c_.put_calls;
    const std::size_t n = std::min(keys.size(), values.size());
    if (n == 0) return store_status::kOk;
    std::size_t written = 0;
    const store_status st = route(
        "SET", keys.first(n), values.first(n), false, [&](std::size_t i, int node, redisReply* r) {
          const bool ok = r->type == REDIS_REPLY_STATUS;
          if (ok) {
            ++written;
            ++c_.keys_written;
            ++nodes_[static_cast<std::size_t>(node)].stats.keys_written;
            c_.bytes_written += static_cast<std::int64_t>(values[i].size());
          } else {
            ++c_.put_rejected;
            if (detail::redis_denied(r)) ++c_.denied;
          }
          freeReplyObject(r);
          return ok;
        });
    return st == store_status::kOk && written < n ? store_status::kUnavailable : st;
  }

  store_status contains(std::span<const store_key> keys, std::vector<std::uint8_t>& out) {
    out.assign(keys.size(), 0);
    if (keys.empty()) return store_status::kOk;
    return route("EXISTS", keys, {}, opt_.read_from_replicas,
                 [&](std::size_t i, int, redisReply* r) {
                   out[i] = r->type == REDIS_REPLY_INTEGER && r->integer > 0 ? 1 : 0;
                   freeReplyObject(r);
                   return true;
                 });
  }

  /// One DEL per key (a DEL of keys in several slots is refused with CROSSSLOT).
  store_status erase(std::span<const store_key> keys) {
    if (keys.empty()) return store_status::kOk;
    bool all = true;
    const store_status st = route("DEL", keys, {}, false, [&](std::size_t, int, redisReply* r) {
      all = all && r->type == REDIS_REPLY_INTEGER;
      freeReplyObject(r);
      return true;
    });
    return st == store_status::kOk && !all ? store_status::kUnavailable : st;
  }

  [[nodiscard]] store_counters counters() const noexcept { return c_; }
  [[nodiscard]] const redis_cluster_counters& cluster_counters() const noexcept { return cc_; }
  [[nodiscard]] const redis_cluster_options& options() const noexcept { return opt_; }
  /// Every node known (seeds, masters, replicas), with what it served.
  [[nodiscard]] std::vector<redis_cluster_node_stats> node_stats() const {
    std::vector<redis_cluster_node_stats> v;
    for (const cluster_node& n : nodes_) v.push_back(n.stats);
    return v;
  }
  /// The node that serves `slot` now, as this client's map has it ("" when none does).
  [[nodiscard]] std::string owner_of(int slot) const {
    const int n =
        slot >= 0 && slot < kRedisClusterSlots ? owner_[static_cast<std::size_t>(slot)] : -1;
    return n < 0 ? std::string() : nodes_[static_cast<std::size_t>(n)].stats.name;
  }
  /// Lowers max_value_bytes to n on every node (never raises it).
  void limit_value_bytes(std::size_t n) noexcept {
    opt_.max_value_bytes = std::min(opt_.max_value_bytes, n);
    for (cluster_node& nd : nodes_) nd.link.options().max_value_bytes = opt_.max_value_bytes;
  }
  /// The Redis key of an entry, and its slot.
  [[nodiscard]] std::string name_of(const store_key& k) const { return opt_.key_prefix + k.hex(); }
  [[nodiscard]] int slot_of(const store_key& k) const { return redis_cluster_slot(name_of(k)); }
  /// Loads the slot map now (within the connect and command timeouts); false when no node
  /// answered with one.
  bool refresh() {
    return refresh_map(detail::redis_clock::now() + opt_.connect_timeout + opt_.command_timeout);
  }

 private:
  struct cluster_node {
    detail::redis_link link;
    redis_cluster_node_stats stats;
    std::vector<int> replicas;  ///< for a master: its replicas, as the map has them
  };
  /// One key's command in a round: the node it goes to, and whether ASKING precedes it.
  struct job {
    std::size_t key = 0;
    int node = -1;
    bool asking = false;
  };

  /// The most nodes a client keeps: a map or redirects naming more (a hostile or broken
  /// node) cost misses, not memory.
  static constexpr std::size_t kMaxNodes = 1000;
  /// The node at an endpoint (added when new); -1 past kMaxNodes.
  int node_at(const detail::redis_endpoint& e) {
    const std::string name = e.name();
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].stats.name == name) return static_cast<int>(i);
    if (nodes_.size() >= kMaxNodes) return -1;
    detail::redis_link_options l;
    l.at = e;
    l.user = opt_.user;
    l.password = opt_.password;
    l.readonly = opt_.read_from_replicas;
    l.connect_timeout = opt_.connect_timeout;
    l.retry_interval = opt_.retry_interval;
    l.max_value_bytes = opt_.max_value_bytes;
    cluster_node n{detail::redis_link(std::move(l)), {}, {}};
    n.stats.name = name;
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size() - 1);
  }

  /// The node a key's command goes to first: the slot's master, or one of its replicas for
  /// reads when asked (one that is not resting after a failure; the master when none is up).
  int first_node(int slot, std::size_t i, bool replica_read) const {
    const int m = owner_[static_cast<std::size_t>(slot)];
    if (!replica_read || m < 0) return m;
    const std::vector<int>& r = nodes_[static_cast<std::size_t>(m)].replicas;
    for (std::size_t k = 0; k < r.size(); ++k) {
      const int cand = r[(i + k) % r.size()];
      if (!nodes_[static_cast<std::size_t>(cand)].link.resting()) return cand;
    }
    return m;
  }

  /// Sends `cmd key [value]` for every key to the node that serves it, one pipeline per node,
  /// all at once, following redirects in further rounds, all before one deadline. Hands each
  /// final reply to on_reply(i, node, reply), which owns it and says whether the key counts
  /// as answered. kUnavailable (counted) when no key was answered at all.
  template <class OnReply>
  store_status route(const char* cmd, std::span<const store_key> keys,
                     std::span<const std::span<const std::byte>> values, bool replica_read,
                     OnReply&& on_reply) {
    const auto now = detail::redis_clock::now();
    auto deadline = now + opt_.command_timeout + opt_.connect_timeout;
    if (stale_ && now >= next_refresh_) (void)refresh_map(deadline);
    std::vector<std::string> names(keys.size());
    std::vector<job> pending;
    pending.reserve(keys.size());
    bool answered_any = false;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      names[i] = name_of(keys[i]);
      const int n = first_node(redis_cluster_slot(names[i]), i, replica_read);
      if (n < 0) {
        ++cc_.unmapped;  // no map yet (no node answered), or a slot no master serves
        stale_ = true;
        continue;
      }
      pending.push_back({i, n, false});
    }
    const std::size_t cmd_len = std::strlen(cmd);
    std::vector<std::vector<std::size_t>> by_node;
    std::vector<detail::redis_part> parts;
    std::vector<int> part_node;
    std::vector<job> next;
    for (int round = 0; !pending.empty(); ++round) {
      if (round > opt_.max_redirects) {
        cc_.redirect_limit += static_cast<std::int64_t>(pending.size());  // a loop: misses
        break;
      }
      by_node.assign(nodes_.size(), {});
      for (std::size_t j = 0; j < pending.size(); ++j)
        by_node[static_cast<std::size_t>(pending[j].node)].push_back(j);
      parts.clear();
      part_node.clear();
      for (std::size_t n = 0; n < by_node.size(); ++n) {
        if (by_node[n].empty()) continue;
        cluster_node& nd = nodes_[n];
        bool ok = nd.link.connect(deadline, c_);
        std::size_t replies = 0;
        for (std::size_t k = 0; ok && k < by_node[n].size(); ++k) {
          const job& jb = pending[by_node[n][k]];
          if (jb.asking) {
            const char* a[1] = {"ASKING"};
            const std::size_t al[1] = {6};
            ok = nd.link.append(1, a, al);
            ++replies;
          }
          const std::string& name = names[jb.key];
          const char* argv[3] = {
              cmd, name.data(),
              values.empty() ? nullptr : reinterpret_cast<const char*>(values[jb.key].data())};
          const std::size_t len[3] = {cmd_len, name.size(),
                                      values.empty() ? 0 : values[jb.key].size()};
          ok = ok && nd.link.append(values.empty() ? 2 : 3, argv, len);
          ++replies;
        }
        if (!ok) {
          node_failed(nd);  // down or resting: its keys are misses this call
          continue;
        }
        ++nd.stats.pipelines;
        parts.push_back(detail::redis_part{&nd.link, replies});
        part_node.push_back(static_cast<int>(n));
      }
      // Which job each reply of a part answers (an ASKING's reply answers none).
      std::vector<std::vector<std::int64_t>> reply_job(parts.size());
      for (std::size_t p = 0; p < parts.size(); ++p)
        for (const std::size_t j : by_node[static_cast<std::size_t>(part_node[p])]) {
          if (pending[j].asking) reply_job[p].push_back(-1);
          reply_job[p].push_back(static_cast<std::int64_t>(j));
        }
      next.clear();
      detail::redis_exchange(
          std::span<detail::redis_part>(parts), deadline, c_,
          [&](std::size_t p, std::size_t r, redisReply* reply) {
            const std::int64_t j = reply_job[p][r];
            if (j < 0) {  // ASKING: +OK
              freeReplyObject(reply);
              return;
            }
            const job& jb = pending[static_cast<std::size_t>(j)];
            if (reply->type == REDIS_REPLY_ERROR) {
              detail::redis_endpoint to;
              int slot = -1;
              if (const int kind = parse_redirect(reply, slot, to); kind != 0) {
                freeReplyObject(reply);
                const int target = node_at(to);
                if (target < 0) return;  // past kMaxNodes: a miss
                if (kind == 1) {         // MOVED: the slot has a new owner; the map is stale
                  ++cc_.moved;
                  owner_[static_cast<std::size_t>(slot)] = target;
                  stale_ = true;
                } else {
                  ++cc_.asked;
                }
                next.push_back({jb.key, target, kind == 2});
                return;
              }
            }
            if (on_reply(jb.key, part_node[p], reply)) answered_any = true;
          });
      for (std::size_t p = 0; p < parts.size(); ++p)
        if (parts[p].result != detail::redis_io::kOk)
          node_failed(nodes_[static_cast<std::size_t>(part_node[p])]);
      pending.swap(next);
    }
    if (answered_any) return store_status::kOk;
    ++c_.unavailable;
    return store_status::kUnavailable;
  }

  void node_failed(cluster_node& nd) {
    ++nd.stats.failures;
    ++cc_.node_failures;
    stale_ = true;  // a failover may be under way: reload the map on a later call
  }

  /// 1 for `MOVED slot host:port`, 2 for `ASK slot host:port`, 0 for any other reply.
  static int parse_redirect(const redisReply* r, int& slot, detail::redis_endpoint& to) {
    const std::string_view s(r->str, r->len);
    int kind = 0;
    std::string_view rest;
    if (s.rfind("MOVED ", 0) == 0) {
      kind = 1;
      rest = s.substr(6);
    } else if (s.rfind("ASK ", 0) == 0) {
      kind = 2;
      rest = s.substr(4);
    } else {
      return 0;
    }
    const auto sp = rest.find(' ');
    const auto colon = rest.rfind(':');
    if (sp == std::string_view::npos || colon == std::string_view::npos || colon < sp) return 0;
    const auto num = [](std::string_view d, int hi) {
      if (d.empty() || d.size() > 5 || d.find_first_not_of("0123456789") != std::string_view::npos)
        return -1;
      const int v = std::atoi(std::string(d).c_str());
      return v > hi ? -1 : v;
    };
    slot = num(rest.substr(0, sp), kRedisClusterSlots - 1);
    const int port = num(rest.substr(colon + 1), 65535);
    std::string_view host = rest.substr(sp + 1, colon - sp - 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
      host = host.substr(1, host.size() - 2);
    if (slot < 0 || port <= 0 || host.empty() || host.size() > 255) return 0;
    to.host = std::string(host);
    to.port = port;
    return kind;
  }

  /// Reloads the slot map from CLUSTER SLOTS: the nodes that are up first, then the others
  /// and the seeds, until one answers, all before `deadline`.
  bool refresh_map(detail::redis_clock::time_point deadline) {
    ++cc_.refreshes;
    next_refresh_ = detail::redis_clock::now() + opt_.retry_interval;
    std::vector<int> order;
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t i = 0; i < nodes_.size(); ++i)
        if (nodes_[i].link.up() == (pass == 0)) order.push_back(static_cast<int>(i));
    for (const int n : order) {
      if (detail::redis_clock::now() >= deadline) break;
      detail::redis_link& link = nodes_[static_cast<std::size_t>(n)].link;
      if (!link.connect(deadline, c_)) continue;
      // A map of a cluster with a few hundred nodes fits in 64 Ki elements; a larger reply is
      // refused as its header arrives.
      link.allow_arrays(std::size_t{1} << 16);
      redisReply* got = nullptr;
      const char* argv[2] = {"CLUSTER", "SLOTS"};
      const std::size_t len[2] = {7, 5};
      if (link.append(2, argv, len)) {
        detail::redis_part part{&link, 1};
        detail::redis_exchange(std::span<detail::redis_part>(&part, 1), deadline, c_,
                               [&](std::size_t, std::size_t, redisReply* r) { got = r; });
      }
      link.allow_arrays(0);
      if (got == nullptr) continue;
      const detail::redis_endpoint asked = link.options().at;
      const bool ok = apply_map(got, asked);
      freeReplyObject(got);
      if (ok) {
        stale_ = false;
        return true;
      }
    }
    ++cc_.refresh_failures;
    return false;
  }

  /// Installs the map a CLUSTER SLOTS reply gives, when it is well formed: each entry
  /// [start, end, [host, port, id...], replicas...]; an empty host is the node asked.
  bool apply_map(const redisReply* r, const detail::redis_endpoint& asked) {
    if (r->type != REDIS_REPLY_ARRAY) return false;
    const auto endpoint = [&asked](const redisReply* e, detail::redis_endpoint& out) {
      if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 ||
          e->element[0]->type != REDIS_REPLY_STRING || e->element[1]->type != REDIS_REPLY_INTEGER ||
          e->element[1]->integer <= 0 || e->element[1]->integer > 65535 || e->element[0]->len > 255)
        return false;
      out.host = std::string(e->element[0]->str, e->element[0]->len);
      if (out.host.empty()) out.host = asked.host;
      if (out.host == "?") return false;  // an endpoint the node does not know
      out.port = static_cast<int>(e->element[1]->integer);
      return true;
    };
    std::vector<std::int16_t> owner(kRedisClusterSlots, -1);
    std::vector<std::vector<int>> replicas;
    for (std::size_t i = 0; i < r->elements; ++i) {
      const redisReply* e = r->element[i];
      if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
          e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER)
        return false;
      const long long lo = e->element[0]->integer, hi = e->element[1]->integer;
      if (lo < 0 || hi < lo || hi >= kRedisClusterSlots) return false;
      detail::redis_endpoint m;
      if (!endpoint(e->element[2], m)) return false;
      const int mi = node_at(m);
      if (mi < 0) return false;
      if (replicas.size() < nodes_.size()) replicas.resize(nodes_.size());
      for (std::size_t k = 3; k < e->elements; ++k) {
        detail::redis_endpoint rep;
        if (!endpoint(e->element[k], rep)) continue;  // a replica without an endpoint
        const int ri = node_at(rep);
        if (ri < 0) return false;
        replicas.resize(nodes_.size());
        auto& list = replicas[static_cast<std::size_t>(mi)];
        if (std::find(list.begin(), list.end(), ri) == list.end()) list.push_back(ri);
      }
      for (long long s = lo; s <= hi; ++s)
        owner[static_cast<std::size_t>(s)] = static_cast<std::int16_t>(mi);
    }
    replicas.resize(nodes_.size());
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      nodes_[i].stats.master = false;
      nodes_[i].replicas = replicas[i];
    }
    for (const std::int16_t o : owner)
      if (o >= 0) nodes_[static_cast<std::size_t>(o)].stats.master = true;
    owner_.assign(owner.begin(), owner.end());
    return true;
  }

  redis_cluster_options opt_;
  std::deque<cluster_node> nodes_;  ///< a deque: a node added mid-call leaves the others in place
  std::vector<int> owner_;          ///< slot -> node index (-1: unknown)
  bool stale_ = true;               ///< reload the map before the next call (none loaded yet)
  detail::redis_clock::time_point next_refresh_{};
  store_counters c_;
  redis_cluster_counters cc_;
};

static_assert(kv_store<redis_cluster_store>, "redis_cluster_store must model kv_store");

RELOKV_NAMESPACE_END
