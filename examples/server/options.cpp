// relokv_server's command line (options.hpp).
#include "options.hpp"

#include <CLI/CLI.hpp>

namespace relokv_server {

int parse_options(int argc, char** argv, server_options& o) {
  CLI::App app{"relokv_server: OpenAI-compatible chat completions with relocatable RAG spans"};
  app.add_option("--model,-m", o.model_path,
                 "GGUF model (default: the scripts/get-model cache, SmolLM2-135M-Instruct)");
  app.add_option("--host", o.host, "address to listen on (default 127.0.0.1)");
  app.add_option("--port", o.port, "port (default 8080; 0: any free port, printed)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--engine", o.engine,
                 "relokv (the example engine: every strategy, sequences batched) or llama.cpp "
                 "(relokv inside llama.cpp: static strategies, one sequence at a time)")
      ->check(CLI::IsMember({"relokv", "llama.cpp"}));
  app.add_option("--alias", o.alias, "the model's name in the API (default: the file's)");
  app.add_option("--strategy", o.strategy,
                 "recompute strategy for the documents: full, prefix, naive, block, epic, "
                 "kvboost, cacheblend, union, question, qepic, ape, seam (default epic)");
  app.add_option("--links", o.links,
                 "a span-link adapter for this model (tools/links): its learned rows open the "
                 "question of every request with spans, on top of the strategy")
      ->check(CLI::ExistingFile);
  app.add_option("--spans", o.spans,
                 "where a request's relocatable spans come from: auto (the documents field, or "
                 "else the passages found in the message text, whatever its format: lines, "
                 "labels, tags, and spans seen before wherever they recur; docs/span-finding.md), "
                 "documents (the documents field only), off (exact "
                 "prefixes only) (default auto)")
      ->check(CLI::IsMember({"auto", "documents", "off"}));
  app.add_option("--compile-spans", o.compile_spans,
                 "how a span first seen is cached: in-context (computed in the request that "
                 "shows it; default) or alone (compiled behind the prefix before the request, "
                 "as span-link adapters are trained: measured worse at ten passages, "
                 "docs/server.md)")
      ->check(CLI::IsMember({"in-context", "alone"}));
  app.add_option("--span-min-tokens", o.limits.chunks.min_span,
                 "--spans auto: a passage shorter than this is computed in every request "
                 "(default 16)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--known-spans", o.known_spans,
                 "--spans auto: spans remembered (by hash, per tenant) to be found again "
                 "wherever they recur in later prompts; 0: the rules alone (default 65536)")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--profile", o.profile,
                 "calibration profile (relokv_rag --calibrate); refused for another model");
  app.add_option("--escalate", o.escalate,
                 "recompute a request in full before its first token when the default "
                 "strategy's first distribution looks unsure: margin<T@first or entropy>T@first "
                 "(a profile's own policy otherwise)");
  app.add_option("--system-prompt", o.system_prompt,
                 "the system message when a request has none (default: the model's own, from "
                 "its chat template; none when it has none)");
  app.add_option("--ctx", o.ctx, "context: prompt plus completion, in tokens (default 4096)")
      ->check(CLI::Range(64, 8192));
  app.add_option("--block-size", o.block_size, "tokens per KV block (default 16)")
      ->check(CLI::Range(1, 256));
  app.add_option("--kv-blocks", o.kv_blocks,
                 "KV pool, in blocks (default: the context for every parallel sequence, at "
                 "least 2048)")
      ->check(CLI::Range(16, 1 << 22));
  app.add_option("--parallel", o.parallel, "sequences computed together (default 16)")
      ->check(CLI::Range(1, 256));
  app.add_option("--queue", o.queue, "requests waiting beyond them; more get 503 (default 64)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--prefill-chunk", o.prefill_chunk,
                 "prompt rows per step, so that long prompts do not stall decode (default 256)")
      ->check(CLI::Range(1, 8192));
  app.add_option("--schedule", o.schedule,
                 "which prefilling prompts a step's rows go to first: fcfs (admission order; "
                 "default) or least-work (the fewest rows left to compute, as a follow-up turn "
                 "or a mostly reused prompt; one passed over eight steps goes first)")
      ->check(CLI::IsMember({"fcfs", "least-work"}));
  app.add_option("--step-tokens", o.step_tokens,
                 "rows a step computes: a decode row per running sequence, the rest prompt "
                 "chunks of as many prefilling sequences as fit (default 512)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--max-tokens", o.limits.default_max_tokens,
                 "completion tokens when a request names none (default 256)")
      ->check(CLI::Range(1, 8192));
  app.add_option("--max-documents", o.limits.max_documents, "documents per request (default 32)")
      ->check(CLI::Range(0, 1024));
  // The HTTP layer's limits (http.hpp): every one applies whatever the framing.
  app.add_option("--max-body", o.http.max_body_bytes,
                 "request body bytes, chunked or not; more get 413 (default 1 MiB)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 30));
  app.add_option("--max-header-bytes", o.http.max_header_bytes,
                 "request line and header bytes; more get 431 (default 16384)")
      ->check(CLI::Range(1024u, 1u << 20));
  app.add_option("--max-header-fields", o.http.max_header_fields,
                 "header lines; more get 431 (default 64)")
      ->check(CLI::Range(std::size_t{4}, std::size_t{4096}));
  app.add_option("--max-connections", o.http.max_connections,
                 "open connections in all; more are closed at once (default 512)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  app.add_option("--max-connections-per-client", o.http.max_connections_per_client,
                 "open connections from one client address (default 64)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  double request_timeout = 15, write_timeout = 30;
  app.add_option("--request-timeout", request_timeout,
                 "seconds for a request to arrive whole, headers and body, and for a kept-alive "
                 "connection to send its next one (default 15)")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--write-timeout", write_timeout,
                 "seconds one write may wait for a client that does not read (default 30)")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--store", o.store_url,
                 "where spans outlive the process and travel between servers: redis://HOST:PORT, "
                 "redis-cluster://..., file:DIR, memory:");
  app.add_option("--store-key-file", o.store_key_file, "seal the store's blocks with this key");
  app.add_option("--store-prefetch-mib", o.prefetch_mib,
                 "MiB of store entries fetched ahead for waiting requests, off the scheduler's "
                 "thread; an entry past it is computed instead (default 1024)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--api-key-file", o.api_key_file,
                 "API keys, one KEY:TENANT a line, in a file only its owner can read (chmod "
                 "600); RELOKV_API_KEYS (KEY:TENANT,...) is read too. Without keys, none is asked");
  app.add_option("--api-key", o.api_keys,
                 "KEY:TENANT (repeatable): visible to every user in ps; prefer --api-key-file");
  app.add_option("--admin-key-file", o.admin_key_file,
                 "the key that reads /metrics on the API port (a file only its owner can read)");
  app.add_option("--metrics-host", o.metrics_host,
                 "address of the metrics listener (default 127.0.0.1)");
  app.add_option("--metrics-port", o.metrics_port,
                 "a listener serving only /metrics and /health, without keys (default: none; "
                 "0: any free port, printed)")
      ->check(CLI::Range(-1, 65535));
  app.add_option("--ssl-cert-file", o.tls.cert_file, "HTTPS: the certificate chain (PEM)");
  app.add_option("--ssl-key-file", o.tls.key_file, "HTTPS: the private key (PEM)");
  app.add_flag("--share-spans", o.share_spans,
               "tenants share cached spans (each still its own principal for provenance)");
  app.add_option("--drain-timeout", o.drain_timeout,
                 "seconds SIGTERM lets requests in flight run; then they end (503, or an error "
                 "event) and the server exits within 2 s (default 30)")
      ->check(CLI::Range(0.0, 3600.0));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (o.tls.cert_file.empty() != o.tls.key_file.empty()) {
    std::fprintf(stderr, "relokv_server: --ssl-cert-file and --ssl-key-file go together\n");
    return 2;
  }
  o.http.request_timeout =
      std::chrono::milliseconds(static_cast<std::int64_t>(request_timeout * 1000));
  o.http.idle_timeout = o.http.request_timeout;
  o.http.write_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(write_timeout * 1000));
  o.limits.context = o.ctx;
  return -1;
}

}  // namespace relokv_server
