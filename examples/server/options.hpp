#pragma once
// relokv_server's command line: every option, its default and its range (CLI11).
#include <cstdint>
#include <string>
#include <vector>

#include "api.hpp"
#include "http.hpp"

namespace relokv_server {

struct server_options {
  std::string model_path, host = "127.0.0.1", alias, strategy = "epic", profile;
  std::string links;                         ///< --links: a span-link adapter (tools/links)
  std::string spans = "auto";                ///< --spans: auto, documents or off
  std::string compile_spans = "in-context";  ///< --compile-spans: in-context or alone
  std::string schedule = "fcfs";             ///< --schedule: fcfs or least-work
  std::string engine = "relokv";
  std::string escalate;       ///< --escalate POLICY for the default strategy
  std::string system_prompt;  ///< empty: the model's own default (its chat template's)
  int port = 8080;
  std::int32_t ctx = 4096, kv_blocks = 0, parallel = 16, queue = 64, prefill_chunk = 256;
  std::int32_t step_tokens = 512;  ///< --step-tokens: rows a scheduler step computes
  std::int32_t block_size = 16;
  double drain_timeout = 30;
  std::string store_url, store_key_file;
  std::int32_t prefetch_mib = 1024;   ///< --store-prefetch-mib: bytes fetched ahead, staged
  std::vector<std::string> api_keys;  ///< --api-key KEY:TENANT (visible in ps: for tests)
  std::string api_key_file, admin_key_file;
  std::string metrics_host = "127.0.0.1";
  int metrics_port = -1;  ///< -1: no metrics listener of its own
  http::tls_files tls;
  bool share_spans = false;
  api_limits limits;
  std::int32_t known_spans = 1 << 16;  ///< --known-spans
  http::limits http;
};

/// Parses argv. Returns the exit code when the program should end now (--help, an error,
/// already printed), or -1 to go on.
int parse_options(int argc, char** argv, server_options& o);

}  // namespace relokv_server
