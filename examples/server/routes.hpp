#pragma once
// relokv_server's routes: /health, /v1/models, /metrics and /v1/chat/completions on the HTTP
// layer (http.hpp), with tenants (auth.hpp) and the serving loop (engine_core.hpp).
#include <atomic>
#include <map>
#include <string>

#include <relokv/recompute/any_strategy.hpp>
#include <relokv/recompute/escalation.hpp>

#include "api.hpp"
#include "auth.hpp"
#include "engine_core.hpp"
#include "http.hpp"
#include "metrics.hpp"
#include "tokenizer.hpp"

namespace relokv_server {

/// What a request is served with: a strategy and whether documents are spans.
struct serving {
  std::string name;
  relokv::recompute::any_strategy strategy;
  bool spans = true;
  relokv::recompute::escalation_policy escalation{};  ///< @first, or never
};

/// Everything the routes read: set up by main, then read-only (but `draining`).
struct route_context {
  engine_core* core = nullptr;
  metrics* stats = nullptr;
  const http::server* http_layer = nullptr;
  const key_ring* keys = nullptr;
  const relokv_engine::tokenizer* tok = nullptr;
  std::map<std::string, serving> strategies;  ///< by relokv.strategy key
  serving fallback;                           ///< the server's default
  std::string model_name, system_prompt;
  nlohmann::json model_meta;  ///< /v1/models' "meta"
  api_limits limits;
  std::int64_t created = 0;
  std::atomic<bool> draining{false};
};

/// Registers the routes on `s`; `ctx` must outlive it.
void add_routes(http::server& s, route_context& ctx);

}  // namespace relokv_server
