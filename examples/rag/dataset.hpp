#pragma once
// Reading a 2WikiMultihopQA-style dataset line (strict JSON; see parse_qa_line).
#include <string>
#include <utility>
#include <vector>

namespace relokv_rag {

/// One dataset record as it stands in the file.
struct qa_record {
  std::string question, answer;
  std::vector<std::pair<std::string, std::string>> passages;  // title, text (sentences joined)
};
/// Parses one JSONL line strictly (RFC 8259 through nlohmann/json: no leading zeros, signs,
/// lone surrogates, raw control characters or invalid UTF-8; nesting at most 32 deep).
/// @throws std::runtime_error "WHERE: ..." naming the column or the field
///         (context[3][1][0], say) and what is wrong.
qa_record parse_qa_line(const std::string& line, const std::string& where);

}  // namespace relokv_rag
