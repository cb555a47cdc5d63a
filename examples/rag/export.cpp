// The tokenized workload as JSON, for the span-link trainer (tools/links; see rag.hpp).
#include <fstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "rag.hpp"

namespace relokv_rag {

void export_workload(const std::string& path, const workload& w, const text_codec& codec) {
  nlohmann::json j;
  j["source"] = w.source;
  j["prefix"] = w.prefix;
  j["end_of_turn"] = codec.tok ? codec.tok->end_of_turn() : -1;
  j["corpus"] = nlohmann::json::array();
  for (const passage& p : w.corpus)
    j["corpus"].push_back({{"title", p.title}, {"tokens", p.tokens}});
  j["requests"] = nlohmann::json::array();
  for (const qa_request& r : w.requests)
    j["requests"].push_back({{"passages", r.passages},
                             {"question", r.question},
                             {"question_tokens", r.question_tokens},
                             {"answer", r.answer}});
  std::ofstream out(path);
  out << j.dump() << "\n";
  if (!out) throw std::runtime_error(path + ": cannot write");
}

}  // namespace relokv_rag
