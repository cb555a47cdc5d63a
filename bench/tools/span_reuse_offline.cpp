// The share of `documents`' reuse that plain prompts get, per format, without a server: each
// request of bench/tools/plain_prompts.py cut by relokv::find_spans (one index per format, as
// one server per format), a span counted as reused when its tokens were a span before; with
// `documents`, each document's tokens. Fast enough to compare finder options on every model's
// tokenizer; bench/plain_prompt_reuse measures the same through the server and its cache.
//   bench/tools/plain_prompts.py > p.jsonl
//   relokv_span_reuse_offline --model GGUF --prompts p.jsonl [--min-span N]
#include <relokv/layout/span_finder.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "gguf.hpp"
#include "tokenizer.hpp"

int main(int argc, char** argv) {
  std::string model, prompts;
  relokv::span_finder_options opt;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model")
      model = argv[i + 1];
    else if (a == "--prompts")
      prompts = argv[i + 1];
    else if (a == "--min-span")
      opt.min_span = std::atoi(argv[i + 1]);
  }
  if (model.empty() || prompts.empty()) {
    std::fprintf(stderr,
                 "usage: relokv_span_reuse_offline --model GGUF --prompts JSONL [--min-span N]\n");
    return 2;
  }
  try {
    using tokens = std::vector<relokv::token_t>;
    const auto gguf = relokv_engine::gguf_file::open(model);
    const relokv_engine::tokenizer tok(gguf);
    // A chat template's opening before the message: a forced cut ends it, as the server's.
    const tokens head = tok.encode(tok.open_marked(tok.default_system()));
    std::map<std::string, double> reused;
    std::map<std::string, relokv::span_index> known;
    std::map<std::string, std::set<tokens>> seen;
    std::ifstream in(prompts);
    if (!in) throw std::runtime_error("cannot read " + prompts);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      const std::string fmt = j.at("fmt");
      auto& s = seen[fmt];
      const auto count = [&](const tokens& t) {
        if (s.count(t) != 0) reused[fmt] += static_cast<double>(t.size());
        s.insert(t);
      };
      if (fmt == "documents") {
        for (const auto& d : j.at("docs")) count(tok.encode(d.get<std::string>()));
        continue;
      }
      tokens ids = head;
      const tokens m = tok.encode(j.at("text").get<std::string>());
      ids.insert(ids.end(), m.begin(), m.end());
      std::vector<std::string> pieces;
      for (const auto t : ids) pieces.push_back(tok.decode({t}));
      const std::vector<std::int32_t> forced{static_cast<std::int32_t>(head.size())};
      for (const auto& g : relokv::find_spans(ids, pieces, opt, forced, &known[fmt]))
        if (g.kind == relokv::found_kind::kSpan)
          count(tokens(ids.begin() + g.begin, ids.begin() + g.end));
    }
    const double ref = reused["documents"];
    double least = 1e9;
    for (const auto& [fmt, r] : reused) {
      if (fmt == "documents") continue;
      std::printf("offline_reuse_fraction_%s %.3f\n", fmt.c_str(), r / ref);
      least = std::min(least, r / ref);
    }
    std::printf("offline_reuse_fraction %.3f\n", least);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relokv_span_reuse_offline: %s\n", e.what());
    return 1;
  }
}
