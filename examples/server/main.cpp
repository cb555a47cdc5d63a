// relokv_server: an OpenAI-compatible chat completion server on relokv's engine, for RAG. Each
// entry of a request's `documents` is a relocatable span: cached on first sight, reused at any
// position afterwards. Started as llama-server is:
//   relokv_server --model MODEL.gguf --host 127.0.0.1 --port 8080
// (scripts/serve fetches the default model and starts it). See README "Serve" and
// docs/server.md. The rooms: options.cpp (the command line), http.cpp (the HTTP layer and its
// limits), auth.cpp (keys and tenants), routes.cpp (the API), the serving loop (engine_core.cpp:
// scheduler.cpp decides a step, executor.cpp runs it on the engine, output_processor.cpp samples
// and publishes), and here the wiring: model, engine, strategies, listeners, signals, the drain.
#include <pthread.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include <relokv/store/any_store.hpp>
#include <relokv/store/prefetching_store.hpp>
#include <relokv/store/store_url.hpp>
#include <relokv/store/write_behind.hpp>

#include "auth.hpp"
#include "engine_core.hpp"
#include "load_model.hpp"
#include "metrics.hpp"
#include "model_path.hpp"
#include "options.hpp"
#include "routes.hpp"
#include "serving_engine.hpp"
#include "strategy_profile.hpp"

namespace {

using relokv_server::serving;

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

/// The strategies by key (the engine's table) and the default: --strategy, a profile's, an
/// escalation policy on top.
void pick_strategies(const relokv_server::server_options& o,
                     const relokv_engine::llama_model& model, relokv_server::route_context& c) {
  for (const auto& n : relokv_engine::strategy_table())
    c.strategies[n.key] = serving{n.key, n.spec.make(), n.spans, {}};
  if (!c.strategies.contains(o.strategy))
    throw std::runtime_error("unknown --strategy '" + o.strategy + "'");
  serving def = c.strategies[o.strategy];
  if (!o.profile.empty()) {
    const auto p = relokv_engine::load_profile(o.profile);
    def.strategy = relokv_engine::profile_strategy(p, model);  // throws for another model
    def.name = p.safe ? "profile: " + p.strategy.label() : "profile: unsafe, full recompute";
    def.spans = !p.safe || p.strategy.kind != "full";
    if (p.safe) def.escalation = server_policy(p.escalation, o.profile);
  }
  if (!o.escalate.empty())
    def.escalation =
        server_policy(relokv::recompute::escalation_policy::parse(o.escalate), "--escalate");
  if (def.escalation.enabled) def.name += " + " + def.escalation.label();
  c.fallback = def;
}

/// The keys: --api-key-file, RELOKV_API_KEYS, --api-key; the admin key.
void load_keys(const relokv_server::server_options& o, relokv_server::key_ring& keys) {
  if (!o.api_key_file.empty())
    keys.add(relokv_server::key_ring::read_file(o.api_key_file), "--api-key-file", o.share_spans);
  keys.add(relokv_server::key_ring::from_env("RELOKV_API_KEYS"), "RELOKV_API_KEYS", o.share_spans);
  keys.add(o.api_keys, "--api-key", o.share_spans);
  if (!o.admin_key_file.empty())
    keys.set_admin(relokv_server::key_ring::read_single(o.admin_key_file));
}

}  // namespace

int main(int argc, char** argv) {
  relokv_server::server_options o;
  if (const int rc = relokv_server::parse_options(argc, argv, o); rc >= 0) return rc;

  // SIGINT and SIGTERM are taken by the main thread (sigwait), blocked everywhere else.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  try {
    if (o.model_path.empty()) o.model_path = relokv_engine::default_model_path();
    if (o.model_path.empty())
      throw std::runtime_error(
          "no model: pass --model MODEL.gguf, or run scripts/get-model (scripts/serve does)");
    const auto loaded = relokv_engine::load_model(o.model_path);
    if (!loaded.tokenizer) throw std::runtime_error("the model has no tokenizer");
    std::shared_ptr<const relokv_engine::llama_model> served = loaded.model;
    if (!o.links.empty()) {
      served = relokv_engine::with_links(served, relokv_engine::load_links(o.links, *served));
    }
    const auto& model = *served;
    if (o.alias.empty()) o.alias = model_alias(o.model_path);

    relokv_server::route_context c;
    relokv_server::key_ring keys;
    load_keys(o, keys);
    pick_strategies(o, model, c);

    relokv::any_store store;
    relokv::store_prefetcher prefetcher;
    if (!o.store_url.empty()) {
      relokv::seal_options seal;
      seal.key_file = o.store_key_file;
      const auto open = [&] { return relokv::any_store::from_url(o.store_url, seal); };
      store = open();
      if (o.engine != "llama.cpp" && o.store_url != "memory:") {
        // The serving loop's thread never waits for the store: puts are written behind it, and
        // the entries a request's plan reads are fetched while it waits (three connections).
        const std::string shown = store.description();
        relokv::prefetch_options po;
        po.max_staged_bytes = static_cast<std::size_t>(o.prefetch_mib) << 20;
        relokv::prefetching_store<relokv::any_store> pf(
            relokv::any_store(relokv::write_behind<relokv::any_store>(std::move(store), open()),
                              shown),
            open(), po);
        prefetcher = pf.prefetcher();
        store = relokv::any_store(std::move(pf), shown);
      }
    } else if (!o.store_key_file.empty()) {
      throw std::runtime_error("--store-key-file without --store");
    }
    const std::int32_t per_seq = o.ctx / o.block_size + 2;
    if (o.kv_blocks == 0) o.kv_blocks = std::max(2048, per_seq * o.parallel);
    if (o.kv_blocks < per_seq)
      throw std::runtime_error("--kv-blocks " + std::to_string(o.kv_blocks) +
                               " cannot hold one request of the context (" +
                               std::to_string(per_seq) + " blocks)");
    std::unique_ptr<relokv_server::serving_engine> engine =
        o.engine == "llama.cpp"
            ? relokv_server::make_llama_cpp_engine(o.model_path, o.kv_blocks, o.ctx,
                                                   std::move(store), served->links)
            : relokv_server::make_relokv_engine(served, o.kv_blocks, std::move(store), o.block_size,
                                                std::move(prefetcher));
    relokv_server::metrics metrics;
    relokv_server::engine_core core(*engine, *loaded.tokenizer, metrics,
                                    {o.parallel, o.queue, o.prefill_chunk, o.step_tokens,
                                     o.compile_spans == "alone", o.schedule == "least-work"});

    relokv_server::http::server http(o.http);
    c.core = &core;
    c.stats = &metrics;
    c.http_layer = &http;
    c.keys = &keys;
    c.tok = loaded.tokenizer.get();
    c.model_name = o.alias;
    c.system_prompt =
        o.system_prompt.empty() ? loaded.tokenizer->default_system() : o.system_prompt;
    c.limits = o.limits;
    c.limits.block_size = engine->block_size();
    c.limits.known_spans =
        o.known_spans > 0
            ? std::make_shared<relokv::span_index>(static_cast<std::size_t>(o.known_spans))
            : nullptr;
    using source = relokv_server::api_limits::span_source;
    c.limits.spans = o.spans == "off"         ? source::kOff
                     : o.spans == "documents" ? source::kDocuments
                                              : source::kAuto;
    if (model.links) c.limits.links = model.links->layout_rows(model.cfg.vocab);
    c.created = static_cast<std::int64_t>(std::time(nullptr));
    c.model_meta = {
        {"architecture", model.cfg.arch}, {"n_layers", model.cfg.n_layers}, {"context", o.ctx},
        {"engine", engine->name()},       {"strategy", c.fallback.name},    {"spans", o.spans}};
    if (model.links)
      c.model_meta["links"] = {{"rows", model.links->n},
                               {"file", std::filesystem::path(model.links->path).filename()}};
    relokv_server::add_routes(http, c);
    o.port = http.listen(o.host, o.port, o.tls);
    int metrics_port = -1;
    if (o.metrics_port >= 0)
      metrics_port =
          http.listen(o.metrics_host, o.metrics_port, {}, {"/metrics", "/health"}, "metrics");
    http.start();
    if (metrics_port >= 0)
      std::fprintf(stderr, "relokv_server: metrics on http://%s:%d/metrics\n",
                   o.metrics_host.c_str(), metrics_port);
    const std::string store_shown = relokv::redact_url(o.store_url);
    std::fprintf(stderr,
                 "relokv_server: %s (%s, %d layers) on %s, strategy %s, %d KV blocks, %d parallel, "
                 "context %d%s%s\nrelokv_server: listening on %s://%s:%d\n",
                 o.alias.c_str(), model.cfg.arch.c_str(), model.cfg.n_layers,
                 engine->name().c_str(), c.fallback.name.c_str(), o.kv_blocks, o.parallel, o.ctx,
                 store_shown.empty() ? "" : ", store ", store_shown.c_str(),
                 o.tls.enabled() ? "https" : "http", o.host.c_str(), o.port);
    std::fflush(stderr);

    // SIGTERM or SIGINT: stop accepting, let what is in flight run up to --drain-timeout,
    // then end it (503 or an error event) and exit, within --drain-timeout + 2 s whatever
    // the clients do.
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "relokv_server: signal %d: draining %d requests\n", sig, core.in_flight());
    std::fflush(stderr);
    c.draining = true;
    http.drain();
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<std::int64_t>(o.drain_timeout * 1000));
    while (core.in_flight() > 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (core.in_flight() > 0) {
      std::fprintf(stderr, "relokv_server: drain timeout: ending %d requests\n", core.in_flight());
      core.cancel_all(503, "the server is shutting down");
      // Their answers (503s and error events) go out; a client that does not read is left.
      const auto grace = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
      while (core.in_flight() > 0 && std::chrono::steady_clock::now() < grace)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // The jobs are done; their last bytes (the final event, the last chunk) are written on the
    // connections' strands: wait for every response to end (or its client to go), at most
    // 1 s, then stop the I/O. A fixed pause cut streams on a loaded host.
    const auto written = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
    while (http.answering() > 0 && std::chrono::steady_clock::now() < written)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    http.stop();
    core.stop();
    std::fprintf(stderr, "relokv_server: stopped\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relokv_server: %s\n", e.what());
    return 1;
  }
}
