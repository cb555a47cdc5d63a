// Strict dataset lines through nlohmann/json (see dataset.hpp).
#include "dataset.hpp"

#include <cstddef>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace relokv_rag {
namespace {

using json = nlohmann::json;
constexpr std::size_t kMaxDepth = 32;

const json& field(const json& j, const char* name, const std::string& where) {
  if (!j.is_object()) throw std::runtime_error(where + ": the record is not an object");
  const auto it = j.find(name);
  if (it == j.end()) throw std::runtime_error(where + ": field '" + name + "' is missing");
  return *it;
}
const std::string& text_of(const json& j, const std::string& path, const std::string& where) {
  if (!j.is_string())
    throw std::runtime_error(where + ": " + path + " is " + j.type_name() + ", not a string");
  return j.get_ref<const std::string&>();
}
const json::array_t& list_of(const json& j, const std::string& path, const std::string& where) {
  if (!j.is_array())
    throw std::runtime_error(where + ": " + path + " is " + j.type_name() + ", not a list");
  return j.get_ref<const json::array_t&>();
}

}  // namespace

qa_record parse_qa_line(const std::string& line, const std::string& where) {
  json j;
  try {
    // The callback sees every value with its depth before it is built: deep nesting stops at
    // the limit instead of growing without bound.
    j = json::parse(line, [&](int depth, json::parse_event_t, json&) {
      if (static_cast<std::size_t>(depth) > kMaxDepth)
        throw std::runtime_error(where + ": nesting deeper than " + std::to_string(kMaxDepth));
      return true;
    });
  } catch (const json::parse_error& e) {
    throw std::runtime_error(where + ": column " + std::to_string(e.byte) + ": " + e.what());
  } catch (const json::exception& e) {  // a number out of range (1e999)
    throw std::runtime_error(where + ": " + e.what());
  }
  qa_record r;
  r.question = text_of(field(j, "question", where), "question", where);
  r.answer = text_of(field(j, "answer", where), "answer", where);
  const auto& ctx = list_of(field(j, "context", where), "context", where);
  for (std::size_t i = 0; i < ctx.size(); ++i) {
    const std::string at = "context[" + std::to_string(i) + "]";
    const auto& item = list_of(ctx[i], at, where);
    if (item.size() != 2)
      throw std::runtime_error(where + ": " + at + " has " + std::to_string(item.size()) +
                               " elements, not [title, [sentences]]");
    std::pair<std::string, std::string> p;
    p.first = text_of(item[0], at + "[0]", where);
    const auto& sentences = list_of(item[1], at + "[1]", where);
    // The sentences of a passage, joined by a space as the dataset's own readers join them
    // (each sentence is stored without its separator).
    for (std::size_t k = 0; k < sentences.size(); ++k) {
      if (k > 0) p.second += ' ';
      p.second += text_of(sentences[k], at + "[1][" + std::to_string(k) + "]", where);
    }
    r.passages.push_back(std::move(p));
  }
  return r;
}

}  // namespace relokv_rag
