// relokv_report: relokv's headline figures, one `name value` line each. Ratios are measured
// side by side in this run; times are medians of repeated runs. See README.md for targets.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>

#include "support/attention_figures.hpp"
#include "support/core_figures.hpp"
#include "support/store_figures.hpp"
#if defined(RELOKV_WITH_REDIS) && RELOKV_WITH_REDIS
#include "support/cluster_figures.hpp"
#endif
#if RELOKV_REPORT_ENGINE
#include "support/engine_figures.hpp"
#include "support/rag_figures.hpp"
#endif
#if RELOKV_REPORT_LLAMA_CPP
#include "support/llama_cpp_figures.hpp"
#endif

namespace {
void usage() {
  std::printf(
      "usage: relokv_report [--reps N] [--filter SUBSTRING]\n"
      "  Prints one `name value` line per headline figure.\n"
      "  --reps N     repetitions per figure; the median is reported (default 15)\n"
      "  --filter S   only figures whose name contains S (llama_cpp: that group alone;\n"
      "               engine_, decode_, rotate_, relocate_, store_ at its start: that\n"
      "               group alone;\n"
      "               a filter starting with rag_: the QA group alone; server_: relokv_server\n"
      "               side by side with llama-server, bench/serve_compare, tens of minutes\n"
      "               (server_plain: --spans auto on plain RAG prompts alone, a minute or\n"
      "               two, bench/plain_prompt_reuse; server_rag: real RAG lengths under\n"
      "               aiperf beside llama-server, bench/serve_rag);\n"
      "               server_soak or server_p95: the ten-minute soak under attack,\n"
      "               bench/server_soak.py;\n"
      "               store_cluster: the Redis Cluster group alone; rag_gemma3: the QA\n"
      "               job on Gemma 3 270M (sliding windows), $RELOKV_GEMMA3_REQUESTS\n"
      "               questions; rag_links: span links on held-out questions;\n"
      "               rag_learned: the best learned adapter at <= 5%% of the work\n"
      "               (SmolLM2, Gemma 3, Qwen2.5-0.5B), $RELOKV_LEARNED_REQUESTS\n"
      "               questions; rag_learned_qwen15: the 1.5B's, 64 at least, with\n"
      "               EM and F1 against the gold answers;\n"
      "               rag_escalation: the\n"
      "               escalation study on SmolLM2, $RELOKV_ESCALATION_REQUESTS questions;\n"
      "               python_: a plan from Python against the same plan in C++,\n"
      "               bench/python_plan_overhead.py; vllm_: relokv inside vLLM's OpenAI\n"
      "               server beside its prefix caching under aiperf, bench/vllm_serve;\n"
      "               vllm_layout: offline with relokv's layout, bench/vllm_compare; both\n"
      "               install vLLM's CPU build)\n");
}
// Runs a figure script and passes on its lines that start with `filter`; false when the script
// cannot start or ends in failure.
bool run_script(const char* script, const std::string& filter) {
  FILE* p = popen(script, "r");
  if (p == nullptr) {
    std::fprintf(stderr, "relokv_report: cannot run %s\n", script);
    return false;
  }
  char line[512];
  while (std::fgets(line, sizeof line, p) != nullptr)
    if (std::string(line).rfind(filter, 0) == 0) std::fputs(line, stdout);
  return pclose(p) == 0;
}
}  // namespace

int main(int argc, char** argv) {
  int reps = 15;
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
      if (reps < 1) {
        std::fprintf(stderr, "relokv_report: --reps needs a positive number\n");
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) {
      filter = argv[++i];
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "relokv_report: unknown option '%s'\n", argv[i]);
      usage();
      return 2;
    }
  }
  const auto print = [&](const relokv_bench::figure_lines& lines) {
    for (const auto& [name, value] : lines)
      if (filter.empty() || name.find(filter) != std::string::npos)
        std::printf("%s %.3g\n", name.c_str(), value);
    std::fflush(stdout);
  };
  // --filter llama_cpp runs that group alone, --filter rag_... the QA group alone (the others
  // take minutes).
  const bool llama_only = filter.find("llama_cpp") != std::string::npos;
  if (filter.rfind("server_soak", 0) == 0 || filter.rfind("server_p95", 0) == 0) {
    // The soak: normal users and every hostile class at once, ten minutes
    // (bench/server_soak.py), its server_soak_* and server_p95_* lines.
    return run_script(RELOKV_SERVER_SOAK, filter) ? 0 : 1;
  }
  if (filter.rfind("vllm_", 0) == 0) {
    // relokv inside vLLM beside vLLM's prefix caching (docs/vllm.md; both install vLLM's CPU
    // build, minutes): vllm_layout, offline with relokv's layout (bench/vllm_compare); any
    // other vllm_ filter, vLLM's OpenAI server under aiperf on plain prompts (bench/vllm_serve);
    // vllm_ alone: both.
    int rc = 0;
    const bool layout = filter.rfind("vllm_layout", 0) == 0;
    for (const char* script : {RELOKV_VLLM_COMPARE, RELOKV_VLLM_SERVE}) {
      const bool mine = (script == std::string(RELOKV_VLLM_COMPARE)) == layout;
      if (!mine && filter != "vllm_") continue;
      if (!run_script(script, filter)) rc = 1;
    }
    return rc;
  }
  if (filter.rfind("server_", 0) == 0) {
    // relokv_server under load for minutes: scripts, their server_ lines. server_plain: the
    // plain-prompt reuse (bench/plain_prompt_reuse, relokv_server alone, a minute or two);
    // server_rag: real RAG lengths under aiperf beside llama-server (bench/serve_rag); any
    // other server_ filter: the toy workload beside llama-server (bench/serve_compare);
    // server_ alone: all three.
    int rc = 0;
    const std::pair<const char*, const char*> scripts[] = {
        {"server_plain", RELOKV_PLAIN_PROMPT_REUSE},
        {"server_rag", RELOKV_SERVE_RAG},
        {"", RELOKV_SERVE_COMPARE}};
    const bool named = filter.rfind("server_plain", 0) == 0 || filter.rfind("server_rag", 0) == 0;
    for (const auto& [group, script] : scripts) {
      const bool mine = *group != '\0' ? filter.rfind(group, 0) == 0 : !named;
      if (!mine && filter != "server_") continue;
      if (!run_script(script, filter)) rc = 1;
    }
    return rc;
  }
  // The Redis Cluster figures start a 6-node cluster on loopback ports (and stop it).
  const auto cluster = [&] {
#if defined(RELOKV_WITH_REDIS) && RELOKV_WITH_REDIS
    if (!relokv_test::find_redis_server().empty() &&
        std::system("redis-cli --version >/dev/null 2>&1") == 0) {
      try {
        print(relokv_bench::cluster_figures(reps, RELOKV_QA_SAMPLE));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "relokv_report: store_cluster_* skipped: no cluster started (%s)\n",
                     e.what());
      }
      return;
    }
#endif
    std::fprintf(stderr,
                 "relokv_report: store_cluster_* skipped: no redis-server and redis-cli here, or a "
                 "build without hiredis\n");
  };
  if (filter.rfind("store_cluster", 0) == 0) {
    cluster();
    return 0;
  }
  if (filter.rfind("rag_gemma3", 0) == 0) {
#if RELOKV_REPORT_ENGINE
    const char* n = std::getenv("RELOKV_GEMMA3_REQUESTS");
    print(relokv_bench::gemma3_report(
        n != nullptr && std::atoi(n) > 1 ? static_cast<std::size_t>(std::atoi(n)) : 32));
#endif
    return 0;
  }
  if (filter.rfind("rag_links", 0) == 0) {
#if RELOKV_REPORT_ENGINE
    const char* n = std::getenv("RELOKV_LINKS_REQUESTS");
    print(relokv_bench::links_report(
        n != nullptr && std::atoi(n) > 1 ? static_cast<std::size_t>(std::atoi(n)) : 24));
#endif
    return 0;
  }
  if (filter.rfind("rag_learned", 0) == 0) {
#if RELOKV_REPORT_ENGINE
    const char* n = std::getenv("RELOKV_LEARNED_REQUESTS");
    print(relokv_bench::learned_report(
        n != nullptr && std::atoi(n) > 1 ? static_cast<std::size_t>(std::atoi(n)) : 48, filter));
#endif
    return 0;
  }
  if (filter.rfind("rag_escalation", 0) == 0) {
#if RELOKV_REPORT_ENGINE
    // $RELOKV_ESCALATION_REQUESTS questions (default 128: about 25 minutes on 2 cores).
    const char* n = std::getenv("RELOKV_ESCALATION_REQUESTS");
    print(relokv_bench::escalation_report(
        n != nullptr && std::atoi(n) > 1 ? static_cast<std::size_t>(std::atoi(n)) : 128));
#endif
    return 0;
  }
  // The Python package's plan overhead (bench/python_plan_overhead.py, seconds): alone under
  // --filter python_, and with everything else.
  const auto python = [&] {
#ifdef RELOKV_PYTHON_PLAN_OVERHEAD
    const std::string cmd = std::string(RELOKV_PYTHON_PLAN_OVERHEAD) + " " + std::to_string(reps);
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) {
      std::fprintf(stderr, "relokv_report: cannot run %s\n", cmd.c_str());
      return 1;
    }
    char line[512];
    while (std::fgets(line, sizeof line, p) != nullptr)
      if (filter.empty() || std::string(line).find(filter) != std::string::npos)
        std::fputs(line, stdout);
    std::fflush(stdout);
    return pclose(p) == 0 ? 0 : 1;
#else
    std::fprintf(stderr,
                 "relokv_report: python_* skipped: this build has no Python package "
                 "(-DRELOKV_BUILD_PYTHON=ON)\n");
    return 0;
#endif
  };
  if (filter.rfind("python_", 0) == 0) return python();
  if (filter.rfind("rag_", 0) == 0) {
#if RELOKV_REPORT_ENGINE
    print(relokv_bench::rag_figures());
#endif
    return 0;
  }
  // A filter that starts as one group's lines do runs that group alone (the others take
  // minutes): engine_, the engine's (bpe_, prefill_, attention_amx too); decode_, rotate_ or
  // relocate_, the attention kernels'; store_, the stores'.
  const auto starts = [&](std::initializer_list<const char*> prefixes) {
    for (const char* x : prefixes)
      if (filter.rfind(x, 0) == 0) return true;
    return false;
  };
  const bool engine_only = starts({"engine_", "bpe_", "prefill_", "attention_amx"});
  const bool attention_only = starts({"decode_", "rotate_", "relocate_"});
  const bool store_only = starts({"store_"});
  const bool one_group = engine_only || attention_only || store_only;
  if (!llama_only) {
    if (!one_group) print(relokv_bench::core_figures(reps));
    if (!one_group || attention_only) print(relokv_bench::attention_figures(reps));
    if (!one_group || store_only) print(relokv_bench::store_figures(reps));
    if (filter.empty() || filter.find("store") != std::string::npos) cluster();
#if RELOKV_REPORT_ENGINE
    if (!one_group || engine_only) print(relokv_bench::engine_figures(reps));
    if (!one_group) print(relokv_bench::rag_figures());
#endif
    if (filter.empty() && python() != 0) return 1;
  }
#if RELOKV_REPORT_LLAMA_CPP
  print(relokv_bench::llama_cpp_figures(reps));
#else
  std::fprintf(stderr,
               "relokv_report: llama_cpp_* skipped: this build has no llama.cpp "
               "(scripts/get-llama-cpp, -DRELOKV_WITH_LLAMA_CPP=ON)\n");
  print({{"llama_cpp_built", 0.0}});
#endif
  return 0;
}
