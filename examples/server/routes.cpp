// relokv_server's routes (routes.hpp).
#include "routes.hpp"

#include <atomic>
#include <ctime>
#include <memory>
#include <random>

namespace relokv_server {

namespace {

using nlohmann::json;

std::string new_id() {
  static std::atomic<std::uint64_t> n{0};
  static const std::uint64_t boot = std::random_device{}();
  char buf[40];
  std::snprintf(buf, sizeof buf, "chatcmpl-%08llx%08llx",
                static_cast<unsigned long long>(boot & 0xffffffffu),
                static_cast<unsigned long long>(++n));
  return buf;
}

void send_error(http::reply& rep, const api_error& e) {
  http::header_list extra;
  if (e.status == 503) extra.emplace_back("Retry-After", "1");
  if (e.status == 401) extra.emplace_back("WWW-Authenticate", "Bearer");
  rep.send(e.status, "application/json", e.body(), std::move(extra));
}

json chunk(const job& j, const std::string& model, std::int64_t created, json delta,
           const json& finish) {
  return {{"id", j.id},
          {"object", "chat.completion.chunk"},
          {"created", created},
          {"model", model},
          {"system_fingerprint", "relokv"},
          {"choices", json::array({{{"index", 0},
                                    {"delta", std::move(delta)},
                                    {"logprobs", nullptr},
                                    {"finish_reason", finish}}})}};
}

json relokv_info(const job& j) {
  return {{"strategy", j.strategy_name},         {"computed_tokens", j.computed_tokens},
          {"reused_tokens", j.cached_tokens},    {"work", j.work},
          {"preemptions", j.preemptions},        {"escalated", j.escalated},
          {"compiled_tokens", j.compiled_tokens}};
}

/// The whole answer of a finished job (under j.mu).
json completion_body(const job& j, const std::string& model, std::int64_t now) {
  return {{"id", j.id},
          {"object", "chat.completion"},
          {"created", now},
          {"model", model},
          {"system_fingerprint", "relokv"},
          {"choices", json::array({{{"index", 0},
                                    {"message", {{"role", "assistant"}, {"content", j.text}}},
                                    {"logprobs", nullptr},
                                    {"finish_reason", j.finish_reason}}})},
          {"usage", usage_json(j.prompt_tokens, j.completion_tokens, j.cached_tokens)},
          {"relokv", relokv_info(j)}};
}

std::string sse(const json& v) { return "data: " + to_text(v) + "\n\n"; }

/// The tenant a request's key names; throws 401 when keys are asked and this one is not one.
const tenant* authorize(const route_context& c, const http::request& req) {
  if (c.keys->empty()) return nullptr;
  const tenant* t = c.keys->find(req.header("Authorization"));
  if (t == nullptr)
    throw api_error(401, "a valid API key is required (Authorization: Bearer KEY)",
                    "invalid_request_error", {}, "invalid_api_key");
  return t;
}

void chat_completion(route_context& c, const http::request& req,
                     const std::shared_ptr<http::reply>& rep) {
  auto j = std::make_shared<job>();
  try {
    const tenant* who = authorize(c, req);
    if (c.draining) throw api_error(503, "the server is shutting down", "server_error");
    j->req = parse_chat_request(req.body, c.limits);
    const serving* s = &c.fallback;
    if (!j->req.strategy.empty()) {
      const auto it = c.strategies.find(j->req.strategy);
      if (it == c.strategies.end())
        throw api_error(400, "unknown relokv.strategy '" + j->req.strategy + "'",
                        "invalid_request_error", "relokv.strategy");
      s = &it->second;
    }
    j->strategy = s->strategy;
    j->strategy_name = s->name;
    j->prompt = build_prompt(j->req, *c.tok, c.system_prompt, s->spans, c.limits,
                             who ? who->keys.tenant_salt : 0);
    j->escalation = s->escalation;
    if (s->escalation.enabled)  // what an escalation recomputes: the plain prompt
      j->full_prompt = build_prompt(j->req, *c.tok, c.system_prompt, false, c.limits);
    if (who) {
      j->keys = who->keys;
      j->principal = who->principal;
    }
    j->id = new_id();
  } catch (const api_error& e) {
    c.stats->rejected(e.status == 401 ? "unauthorized" : e.status == 503 ? "draining" : "invalid");
    c.stats->request_done(e.status);
    send_error(*rep, e);
    return;
  }
  // A client that leaves is released at the serving loop's next step, streamed or not.
  engine_core* core = c.core;
  metrics* stats = c.stats;
  auto ended = std::make_shared<std::atomic<bool>>(false);
  rep->on_disconnect([j, core, stats, ended] {
    j->cancelled = true;
    core->wake();
    if (!ended->exchange(true)) stats->request_done(499);
  });
  const std::string model = c.model_name;
  const auto now = static_cast<std::int64_t>(std::time(nullptr));
  if (!j->req.stream) {
    // The body is built on the connection's strand, never on the serving loop's thread: the
    // loop only says that something changed.
    const std::weak_ptr<job> wj = j;
    j->on_update = [wj, rep, model, now, stats, ended] {
      // Called by the loop, which holds the job: it lives until the strand has read it.
      rep->post([jp = wj.lock(), rep, model, now, stats, ended] {
        std::unique_lock lock(jp->mu);
        if (!jp->done || ended->exchange(true)) return;
        if (jp->error_status != 0) {
          const api_error e(jp->error_status, jp->error_message, "server_error");
          lock.unlock();
          stats->request_done(e.status);
          send_error(*rep, e);
          return;
        }
        const std::string body = to_text(completion_body(*jp, model, now));
        lock.unlock();
        stats->request_done(200);
        rep->send(200, "application/json", body, {});
      });
    };
  } else {
    // Server-sent events: the role first, then each piece of text as it is published, the
    // finish reason, usage when asked, [DONE]; an error ends the stream with an error event.
    struct progress {
      std::size_t sent = 0;
      bool started = false;
    };
    auto st = std::make_shared<progress>();
    rep->stream(
        200, "text/event-stream", {{"Cache-Control", "no-cache"}},
        [j, st, model, now, stats, ended]() -> std::pair<std::string, bool> {
          std::string out;
          if (!st->started) {
            st->started = true;
            out += sse(chunk(*j, model, now, {{"role", "assistant"}, {"content", ""}}, nullptr));
          }
          std::unique_lock lock(j->mu);
          if (j->text.size() > st->sent) {
            out += sse(chunk(*j, model, now, {{"content", j->text.substr(st->sent)}}, nullptr));
            st->sent = j->text.size();
          }
          if (!j->done) return {std::move(out), false};
          if (j->error_status != 0) {
            out += sse(
                json::parse(api_error(j->error_status, j->error_message, "server_error").body()));
          } else {
            out += sse(chunk(*j, model, now, json::object(), j->finish_reason));
            if (j->req.include_usage) {
              json u = chunk(*j, model, now, json::object(), nullptr);
              u["choices"] = json::array();
              u["usage"] = usage_json(j->prompt_tokens, j->completion_tokens, j->cached_tokens);
              u["relokv"] = relokv_info(*j);
              out += sse(u);
            }
          }
          const int status = j->error_status != 0 ? j->error_status : 200;
          lock.unlock();
          out += "data: [DONE]\n\n";
          if (!ended->exchange(true)) stats->request_done(status);
          return {std::move(out), true};
        });
    j->on_update = [rep] { rep->notify(); };
  }
  if (!c.core->submit(j)) {
    ended->store(true);
    c.stats->rejected(c.draining ? "draining" : "queue_full");
    c.stats->request_done(503);
    const api_error e(
        503,
        c.draining ? "the server is shutting down" : "the server is at capacity; retry shortly",
        "server_error", {}, c.draining ? "" : "queue_full");
    if (j->req.stream) {
      // The stream's head may be on its way: end it with the error event.
      {
        const std::lock_guard lock(j->mu);
        j->error_status = 503;
        j->error_message = e.what();
        j->done = true;
      }
      rep->notify();
    } else {
      send_error(*rep, e);
    }
  }
}

/// The HTTP layer's own counters, appended to /metrics.
std::string http_metrics(const http::counters& h) {
  std::string out;
  const auto line = [&out](const char* name, const char* help, const char* type, std::int64_t v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
           name + " " + std::to_string(v) + "\n";
  };
  line("relokv_http_connections_open", "Client connections open now.", "gauge", h.connections_open);
  line("relokv_http_connections_refused_total",
       "Connections closed at accept: over --max-connections or --max-connections-per-client.",
       "counter", h.connections_refused);
  line("relokv_http_header_too_large_total", "Requests refused 431.", "counter",
       h.header_too_large);
  line("relokv_http_body_too_large_total", "Requests refused 413.", "counter", h.body_too_large);
  line("relokv_http_encoding_refused_total", "Compressed bodies refused 415.", "counter",
       h.encoding_refused);
  line("relokv_http_request_timeouts_total",
       "Connections closed because a request did not arrive whole within --request-timeout.",
       "counter", h.timeouts);
  line("relokv_http_disconnects_total", "Clients that left before their response ended.", "counter",
       h.disconnects);
  return out;
}

}  // namespace

void add_routes(http::server& s, route_context& c) {
  s.route("GET", "/health", [&c](const http::request&, std::shared_ptr<http::reply> rep) {
    if (c.draining)
      rep->send(503, "application/json", R"({"status":"draining"})", {{"Retry-After", "1"}});
    else
      rep->send(200, "application/json", R"({"status":"ok"})", {});
  });
  s.route("GET", "/v1/models", [&c](const http::request& req, std::shared_ptr<http::reply> rep) {
    try {
      (void)authorize(c, req);
    } catch (const api_error& e) {
      send_error(*rep, e);
      return;
    }
    const json m = {{"object", "list"},
                    {"data", json::array({{{"id", c.model_name},
                                           {"object", "model"},
                                           {"created", c.created},
                                           {"owned_by", "relokv"},
                                           {"meta", c.model_meta}}})}};
    rep->send(200, "application/json", to_text(m), {});
  });
  // Every tenant's traffic: the admin key's, or an open server's (no keys at all), or the
  // metrics listener's (--metrics-port), which serves nothing else.
  s.route("GET", "/metrics", [&c](const http::request& req, std::shared_ptr<http::reply> rep) {
    const bool open = req.listener == "metrics" || (c.keys->empty() && !c.keys->has_admin());
    if (!open && !c.keys->admin(req.header("Authorization"))) {
      send_error(*rep, api_error(c.keys->has_admin() ? 401 : 403,
                                 c.keys->has_admin()
                                     ? "/metrics needs the admin key (Authorization: Bearer)"
                                     : "/metrics counts every tenant's traffic: it is served to "
                                       "--admin-key-file's key or on --metrics-port",
                                 "invalid_request_error", {}, "admin_only"));
      return;
    }
    rep->send(200, "text/plain; version=0.0.4",
              c.stats->text() + http_metrics(c.http_layer->stats()), {});
  });
  s.route(
      "POST", "/v1/chat/completions",
      [&c](const http::request& req, std::shared_ptr<http::reply> rep) {
        chat_completion(c, req, rep);
      },
      /*offload=*/true);
}

}  // namespace relokv_server
