// relokv_server: an OpenAI-compatible chat completion server on relokv's engine, for RAG. Each
// entry of a request's `documents` is a relocatable span: cached on first sight, reused at any
// position afterwards. Started as llama-server is:
//   relokv_server --model MODEL.gguf --host 127.0.0.1 --port 8080
// (scripts/serve fetches the default model and starts it). See README "Serve" and docs/server.md.
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include <httplib.h>
#include <xxhash.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <relokv/store/any_store.hpp>

#include "api.hpp"
#include "load_model.hpp"
#include "metrics.hpp"
#include "model_path.hpp"
#include "profile.hpp"
#include "rag.hpp"
#include "scheduler.hpp"
#include "serving_engine.hpp"

namespace {

using nlohmann::json;
using relokv_server::api_error;

struct tenant {
  std::string name;
  relokv::extra_keys keys;
  std::uint64_t principal = 0;
};

struct server_config {
  std::string model_path, host = "127.0.0.1", alias, strategy = "epic", profile, engine = "relokv";
  std::string escalate;  ///< --escalate POLICY for the default strategy
  int port = 8080;
  std::int32_t ctx = 4096, kv_blocks = 0, parallel = 16, queue = 64, prefill_chunk = 256;
  std::size_t max_body = 1 << 20;
  double drain_timeout = 30;
  std::string store_url, store_key_file;
  std::vector<std::string> api_keys;
  bool share_spans = false;
  relokv_server::api_limits limits;
};

/// What a request is served with: a strategy and whether documents are spans.
struct serving {
  std::string name;
  relokv::recompute::any_strategy strategy;
  bool spans = true;
  relokv::recompute::escalation_policy escalation{};  ///< @first, or never
};

/// The server escalates before the first token only: a mid-answer escalation would take back
/// streamed tokens, a draft would hold the stream. @throws std::runtime_error for another stage
relokv::recompute::escalation_policy server_policy(const relokv::recompute::escalation_policy& p,
                                                   const std::string& from) {
  if (p.enabled && p.stage != relokv::recompute::escalation_stage::first_token)
    throw std::runtime_error(from + ": escalation policy '" + p.label() +
                             "': relokv_server escalates before the first token only (@first); "
                             "@every and @draft are served by relokv_rag and "
                             "relokv_engine::generate_escalating");
  return p;
}

std::string model_alias(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  if (base.size() > 5 && base.ends_with(".gguf")) base.resize(base.size() - 5);
  return base;
}

std::string new_id() {
  static std::atomic<std::uint64_t> n{0};
  static const std::uint64_t boot = std::random_device{}();
  char buf[40];
  std::snprintf(buf, sizeof buf, "chatcmpl-%08llx%08llx",
                static_cast<unsigned long long>(boot & 0xffffffffu),
                static_cast<unsigned long long>(++n));
  return buf;
}

void send_error(httplib::Response& res, const api_error& e) {
  res.status = e.status;
  res.set_content(e.body(), "application/json");
}

json chunk(const relokv_server::job& j, const std::string& model, std::int64_t created, json delta,
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

json relokv_info(const relokv_server::job& j) {
  return {{"strategy", j.strategy_name},      {"computed_tokens", j.computed_tokens},
          {"reused_tokens", j.cached_tokens}, {"work", j.work},
          {"preemptions", j.preemptions},     {"escalated", j.escalated}};
}

}  // namespace

int main(int argc, char** argv) {
  server_config cfg;
  CLI::App app{"relokv_server: OpenAI-compatible chat completions with relocatable RAG spans"};
  app.add_option("--model,-m", cfg.model_path,
                 "GGUF model (default: the scripts/get-model cache, SmolLM2-135M-Instruct)");
  app.add_option("--host", cfg.host, "address to listen on (default 127.0.0.1)");
  app.add_option("--port", cfg.port, "port (default 8080; 0: any free port, printed)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--engine", cfg.engine,
                 "relokv (the example engine: every strategy, sequences batched) or llama.cpp "
                 "(relokv inside llama.cpp: static strategies, one sequence at a time)")
      ->check(CLI::IsMember({"relokv", "llama.cpp"}));
  app.add_option("--alias", cfg.alias, "the model's name in the API (default: the file's)");
  app.add_option("--strategy", cfg.strategy,
                 "recompute strategy for the documents: full, prefix, naive, block, epic, "
                 "kvboost, cacheblend, union, question, qepic, ape, seam (default epic)");
  app.add_option("--profile", cfg.profile,
                 "calibration profile (relokv_rag --calibrate); refused for another model");
  app.add_option("--escalate", cfg.escalate,
                 "recompute a request in full before its first token when the default "
                 "strategy's first distribution looks unsure: margin<T@first or entropy>T@first "
                 "(a profile's own policy otherwise)");
  app.add_option("--ctx", cfg.ctx, "context: prompt plus completion, in tokens (default 4096)")
      ->check(CLI::Range(64, 8192));
  app.add_option("--kv-blocks", cfg.kv_blocks,
                 "KV pool, in blocks of 16 tokens (default: the context for every parallel "
                 "sequence, at least 2048)")
      ->check(CLI::Range(16, 1 << 22));
  app.add_option("--parallel", cfg.parallel, "sequences computed together (default 16)")
      ->check(CLI::Range(1, 256));
  app.add_option("--queue", cfg.queue, "requests waiting beyond them; more get 503 (default 64)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--prefill-chunk", cfg.prefill_chunk,
                 "prompt rows per step, so that long prompts do not stall decode (default 256)")
      ->check(CLI::Range(1, 8192));
  app.add_option("--max-tokens", cfg.limits.default_max_tokens,
                 "completion tokens when a request names none (default 256)")
      ->check(CLI::Range(1, 8192));
  app.add_option("--max-documents", cfg.limits.max_documents, "documents per request (default 32)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--max-body", cfg.max_body, "request body bytes; more get 413 (default 1 MiB)");
  app.add_option("--store", cfg.store_url,
                 "where spans outlive the process and travel between servers: redis://HOST:PORT, "
                 "file:DIR, memory:");
  app.add_option("--store-key-file", cfg.store_key_file, "seal the store's blocks with this key");
  app.add_option("--api-key", cfg.api_keys,
                 "KEY:TENANT (repeatable): Bearer keys accepted, each a tenant; without any, "
                 "no key is asked");
  app.add_flag("--share-spans", cfg.share_spans,
               "tenants share cached spans (each still its own principal for provenance)");
  app.add_option("--drain-timeout", cfg.drain_timeout,
                 "seconds SIGTERM waits for requests in flight (default 30)");
  CLI11_PARSE(app, argc, argv);

  // SIGINT and SIGTERM are taken by one thread (sigwait), blocked everywhere else.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  try {
    if (cfg.model_path.empty()) cfg.model_path = relokv_engine::default_model_path();
    if (cfg.model_path.empty())
      throw std::runtime_error(
          "no model: pass --model MODEL.gguf, or run scripts/get-model (scripts/serve does)");
    const auto loaded = relokv_engine::load_model(cfg.model_path);
    if (!loaded.tokenizer) throw std::runtime_error("the model has no tokenizer");
    const auto& model = *loaded.model;
    const auto& tok = *loaded.tokenizer;
    if (cfg.alias.empty()) cfg.alias = model_alias(cfg.model_path);
    cfg.limits.context = cfg.ctx;

    // Strategies: the QA program's variants by key; the server's default from --strategy or
    // the profile.
    std::map<std::string, serving> strategies;
    for (auto& v : relokv_rag::default_variants())
      strategies[v.key] = serving{v.key, v.strategy, v.spans};
    if (!strategies.contains(cfg.strategy))
      throw std::runtime_error("unknown --strategy '" + cfg.strategy + "'");
    serving def = strategies[cfg.strategy];
    if (!cfg.profile.empty()) {
      const auto p = relokv_engine::load_profile(cfg.profile);
      def.strategy = relokv_engine::profile_strategy(p, model);  // throws for another model
      def.name = p.safe ? "profile: " + p.strategy.label() : "profile: unsafe, full recompute";
      def.spans = !p.safe || p.strategy.kind != "full";
      if (p.safe) def.escalation = server_policy(p.escalation, cfg.profile);
    }
    if (!cfg.escalate.empty())
      def.escalation =
          server_policy(relokv::recompute::escalation_policy::parse(cfg.escalate), "--escalate");
    if (def.escalation.enabled) def.name += " + " + def.escalation.label();

    std::map<std::string, tenant> tenants;
    for (const std::string& k : cfg.api_keys) {
      const auto colon = k.find(':');
      if (colon == 0 || colon == std::string::npos || colon + 1 == k.size())
        throw std::runtime_error("--api-key wants KEY:TENANT, not '" + k + "'");
      tenant t;
      t.name = k.substr(colon + 1);
      const std::uint64_t h = XXH3_64bits(t.name.data(), t.name.size()) | 1u;
      t.principal = h;
      if (!cfg.share_spans) t.keys.tenant_salt = h;
      tenants[k.substr(0, colon)] = t;
    }

    relokv::any_store store;
    if (!cfg.store_url.empty()) {
      relokv::seal_options seal;
      seal.key_file = cfg.store_key_file;
      store = relokv::any_store::from_url(cfg.store_url, seal);
    } else if (!cfg.store_key_file.empty()) {
      throw std::runtime_error("--store-key-file without --store");
    }
    const std::int32_t per_seq = cfg.ctx / 16 + 2;
    if (cfg.kv_blocks == 0) cfg.kv_blocks = std::max(2048, per_seq * cfg.parallel);
    if (cfg.kv_blocks < per_seq)
      throw std::runtime_error("--kv-blocks " + std::to_string(cfg.kv_blocks) +
                               " cannot hold one request of the context (" +
                               std::to_string(per_seq) + " blocks)");
    std::unique_ptr<relokv_server::serving_engine> engine =
        cfg.engine == "llama.cpp"
            ? relokv_server::make_llama_cpp_engine(cfg.model_path, cfg.kv_blocks, cfg.ctx,
                                                   std::move(store))
            : relokv_server::make_relokv_engine(loaded.model, cfg.kv_blocks, std::move(store));
    relokv_server::metrics metrics;
    relokv_server::scheduler sched(*engine, tok, metrics,
                                   {cfg.parallel, cfg.queue, cfg.prefill_chunk});
    const std::string default_system = model.cfg.arch == "qwen2"
                                           ? "You are a helpful assistant."
                                           : "You are a helpful AI assistant named SmolLM, "
                                             "trained by Hugging Face";
    const auto created = static_cast<std::int64_t>(std::time(nullptr));
    std::atomic<bool> draining{false};
    std::atomic<int> http_active{0};

    httplib::Server svr;
    const int threads = cfg.parallel + cfg.queue + 8;
    svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    svr.set_payload_max_length(cfg.max_body);
    svr.set_read_timeout(30, 0);
    svr.set_write_timeout(30, 0);
    svr.set_error_handler([&](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string what = res.status == 413   ? "the request body is larger than --max-body"
                               : res.status == 404 ? "no such endpoint"
                                                   : "the request was refused";
      res.set_content(api_error(res.status, what).body(), "application/json");
      if (res.status == 413) metrics.rejected("too_large");
    });
    svr.set_exception_handler(
        [&](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "internal error";
          try {
            std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          send_error(res, api_error(500, what, "server_error"));
        });

    svr.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
      if (draining) {
        res.status = 503;
        res.set_content(R"({"status":"draining"})", "application/json");
        return;
      }
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    svr.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
      const json m = {{"object", "list"},
                      {"data", json::array({{{"id", cfg.alias},
                                             {"object", "model"},
                                             {"created", created},
                                             {"owned_by", "relokv"},
                                             {"meta",
                                              {{"architecture", model.cfg.arch},
                                               {"n_layers", model.cfg.n_layers},
                                               {"context", cfg.ctx},
                                               {"engine", engine->name()},
                                               {"strategy", def.name}}}}})}};
      res.set_content(relokv_server::to_text(m), "application/json");
    });
    svr.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics.text(), "text/plain; version=0.0.4");
    });

    svr.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
      ++http_active;
      struct leave {
        std::atomic<int>& n;
        ~leave() { --n; }
      } leave_guard{http_active};
      auto j = std::make_shared<relokv_server::job>();
      try {
        const tenant* who = nullptr;
        if (!tenants.empty()) {
          const std::string auth = req.get_header_value("Authorization");
          const auto it =
              auth.starts_with("Bearer ") ? tenants.find(auth.substr(7)) : tenants.end();
          if (it == tenants.end())
            throw api_error(401, "a valid API key is required (Authorization: Bearer KEY)",
                            "invalid_request_error", {}, "invalid_api_key");
          who = &it->second;
        }
        if (draining) throw api_error(503, "the server is shutting down", "server_error");
        j->req = relokv_server::parse_chat_request(req.body, cfg.limits);
        const serving* s = &def;
        if (!j->req.strategy.empty()) {
          const auto it = strategies.find(j->req.strategy);
          if (it == strategies.end())
            throw api_error(400, "unknown relokv.strategy '" + j->req.strategy + "'",
                            "invalid_request_error", "relokv.strategy");
          s = &it->second;
        }
        j->strategy = s->strategy;
        j->strategy_name = s->name;
        j->prompt = relokv_server::build_prompt(j->req, tok, default_system, s->spans, cfg.limits);
        j->escalation = s->escalation;
        if (s->escalation.enabled)  // what an escalation recomputes: the plain prompt
          j->full_prompt =
              relokv_server::build_prompt(j->req, tok, default_system, false, cfg.limits);
        if (who) {
          j->keys = who->keys;
          j->principal = who->principal;
        }
        j->id = new_id();
      } catch (const api_error& e) {
        metrics.rejected(e.status == 401   ? "unauthorized"
                         : e.status == 503 ? "draining"
                                           : "invalid");
        metrics.request_done(e.status);
        send_error(res, e);
        return;
      }
      if (!sched.submit(j)) {
        metrics.rejected("queue_full");
        metrics.request_done(503);
        res.set_header("Retry-After", "1");
        send_error(res, api_error(503, "the server is at capacity; retry shortly", "server_error",
                                  {}, "queue_full"));
        return;
      }
      const std::string model_name = cfg.alias;
      const auto now = static_cast<std::int64_t>(std::time(nullptr));
      if (!j->req.stream) {
        std::unique_lock lock(j->mu);
        j->cv.wait(lock, [&] { return j->done; });
        if (j->error_status != 0) {
          metrics.request_done(j->error_status);
          send_error(res, api_error(j->error_status, j->error_message, "server_error"));
          return;
        }
        const json body = {
            {"id", j->id},
            {"object", "chat.completion"},
            {"created", now},
            {"model", model_name},
            {"system_fingerprint", "relokv"},
            {"choices", json::array({{{"index", 0},
                                      {"message", {{"role", "assistant"}, {"content", j->text}}},
                                      {"logprobs", nullptr},
                                      {"finish_reason", j->finish_reason}}})},
            {"usage",
             relokv_server::usage_json(j->prompt_tokens, j->completion_tokens, j->cached_tokens)},
            {"relokv", relokv_info(*j)}};
        metrics.request_done(200);
        res.set_content(relokv_server::to_text(body), "application/json");
        return;
      }
      // Server-sent events: the role first, then each piece of text as it is published, the
      // finish reason, usage when asked, [DONE]. A client that goes away cancels the job.
      auto sent = std::make_shared<std::size_t>(0);
      auto started = std::make_shared<bool>(false);
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [j, sent, started, model_name, now](std::size_t, httplib::DataSink& sink) -> bool {
            try {
              const auto emit = [&](const json& v) {
                const std::string line = "data: " + relokv_server::to_text(v) + "\n\n";
                return sink.write(line.data(), line.size());
              };
              if (!*started) {
                *started = true;
                if (!emit(chunk(*j, model_name, now, {{"role", "assistant"}, {"content", ""}},
                                nullptr))) {
                  j->cancelled = true;
                  return false;
                }
              }
              std::unique_lock lock(j->mu);
              while (!j->done && j->text.size() <= *sent) {
                j->cv.wait_for(lock, std::chrono::milliseconds(200));
                if (!sink.is_writable()) {
                  j->cancelled = true;
                  return false;
                }
              }
              std::string piece = j->text.substr(*sent);
              *sent = j->text.size();
              const bool done = j->done;
              const int err = j->error_status;
              const std::string message = j->error_message;
              const std::string reason = j->finish_reason;
              const json usage = relokv_server::usage_json(j->prompt_tokens, j->completion_tokens,
                                                           j->cached_tokens);
              lock.unlock();
              if (!piece.empty() &&
                  !emit(chunk(*j, model_name, now, {{"content", piece}}, nullptr))) {
                j->cancelled = true;
                return false;
              }
              if (!done) return true;
              if (err != 0) {
                emit(json::parse(api_error(err, message, "server_error").body()));
              } else {
                emit(chunk(*j, model_name, now, json::object(), reason));
                if (j->req.include_usage) {
                  json u = chunk(*j, model_name, now, json::object(), nullptr);
                  u["choices"] = json::array();
                  u["usage"] = usage;
                  u["relokv"] = relokv_info(*j);
                  emit(u);
                }
              }
              const std::string end = "data: [DONE]\n\n";
              sink.write(end.data(), end.size());
              sink.done();
              return true;
            } catch (const std::exception&) {
              // Nothing thrown may leave a content provider (httplib would terminate): the
              // stream ends, the job is released.
              j->cancelled = true;
              return false;
            }
          },
          [j, &metrics](bool success) {
            if (!success) j->cancelled = true;
            const std::lock_guard lock(j->mu);
            metrics.request_done(!success ? 499 : j->error_status != 0 ? j->error_status : 200);
          });
    });

    if (cfg.port == 0) {
      cfg.port = svr.bind_to_any_port(cfg.host);
      if (cfg.port < 0) throw std::runtime_error("cannot listen on " + cfg.host);
    } else if (!svr.bind_to_port(cfg.host, cfg.port)) {
      throw std::runtime_error("cannot listen on " + cfg.host + ":" + std::to_string(cfg.port));
    }
    std::fprintf(stderr,
                 "relokv_server: %s (%s, %d layers) on %s, strategy %s, %d KV blocks, %d parallel, "
                 "context %d%s%s\nrelokv_server: listening on http://%s:%d\n",
                 cfg.alias.c_str(), model.cfg.arch.c_str(), model.cfg.n_layers,
                 engine->name().c_str(), def.name.c_str(), cfg.kv_blocks, cfg.parallel, cfg.ctx,
                 cfg.store_url.empty() ? "" : ", store ",
                 cfg.store_url.empty() ? "" : cfg.store_url.c_str(), cfg.host.c_str(), cfg.port);
    std::fflush(stderr);

    // SIGTERM or SIGINT: refuse new requests, let those in flight finish (up to the drain
    // timeout), then stop listening.
    std::thread signals_thread([&] {
      int sig = 0;
      sigwait(&signals, &sig);
      std::fprintf(stderr, "relokv_server: signal %d: draining %d requests\n", sig,
                   sched.in_flight());
      draining = true;
      const auto until =
          std::chrono::steady_clock::now() +
          std::chrono::milliseconds(static_cast<std::int64_t>(cfg.drain_timeout * 1000));
      while ((sched.in_flight() > 0 || http_active > 0) && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      svr.stop();
    });
    svr.listen_after_bind();
    sched.stop();
    // The signal thread ends after svr.stop(); if listen ended otherwise, wake it.
    if (signals_thread.joinable()) {
      if (!draining) pthread_kill(signals_thread.native_handle(), SIGTERM);
      signals_thread.join();
    }
    std::fprintf(stderr, "relokv_server: stopped\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relokv_server: %s\n", e.what());
    return 1;
  }
}
