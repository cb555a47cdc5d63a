#include "rag.hpp"

#include <cstdio>
#include <fstream>
#include <string>

#include "support/catch.hpp"

namespace {
/// The message parse_qa_line throws for a line, or "" when it parses.
std::string complaint(const std::string& line) {
  try {
    (void)relokv_rag::parse_qa_line(line, "f.jsonl:7");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return {};
}
const std::string kGood =
    R"({"question": "caf\u00e9 \"x\"", "answer": "A", "context": [["T", ["s1", "s2"]]]})";
std::string with_question(const std::string& value) {
  return R"({"question": )" + value + R"(, "answer": "A", "context": []})";
}
}  // namespace

TEST_CASE("rag: dataset lines are parsed strictly", "[rag]") {
  const auto r = relokv_rag::parse_qa_line(kGood, "x");
  CHECK(r.question == "café \"x\"");
  REQUIRE(r.passages.size() == 1);
  CHECK(r.passages[0].second == "s1s2");
  // Every malformed line is an error that names the file and line.
  for (const std::string& bad :
       {std::string(R"({"a": [1, 2)"), std::string(R"({"a" 1})"), std::string(R"("open)"),
        with_question("1.2.3"), with_question("01"), with_question("+1"),
        with_question(R"("\ud800")"), with_question(R"("\uzzzz")"), with_question("\"tab\there\""),
        with_question("\"\xff\xfe\""), std::string(5000, '[') + std::string(5000, ']')}) {
    const std::string msg = complaint(bad);
    INFO(bad.substr(0, 60) << " -> " << msg);
    CHECK(msg.find("f.jsonl:7") != std::string::npos);
  }
  CHECK(complaint(std::string(100, '[') + std::string(100, ']')).find("nesting") !=
        std::string::npos);
  // Fields: missing, of the wrong type, or a number where text belongs.
  CHECK(complaint(R"({"answer": "A", "context": []})").find("'question'") != std::string::npos);
  CHECK(complaint(with_question("1e999")).find("f.jsonl:7: ") != std::string::npos);
  CHECK(complaint(with_question("12")).find("question is number") != std::string::npos);
  CHECK(complaint(R"({"question": "q", "answer": "A", "context": [["T", ["s", 3]]]})")
            .find("context[0][1][1]") != std::string::npos);
  CHECK(complaint(R"({"question": "q", "answer": "A", "context": [["T"]]})")
            .find("context[0] has 1") != std::string::npos);
}

TEST_CASE("rag: answer F1 as in SQuAD/CacheBlend", "[rag]") {
  CHECK(relokv_rag::answer_f1("Paris", "paris") == 1.0);
  CHECK(relokv_rag::answer_f1("The Paris.", "Paris") == 1.0);  // articles and punctuation
  CHECK(relokv_rag::answer_f1("in Paris France", "Paris") == Approx(0.5));
  CHECK(relokv_rag::answer_f1("Berlin", "Paris") == 0.0);
  CHECK(relokv_rag::percentile({1, 2, 3, 4}, 50) == Approx(2.5));
}

TEST_CASE("rag: JSONL workloads pool passages and report bad lines", "[rag]") {
  const std::string path = "rag_test_workload.jsonl";
  {
    std::ofstream o(path);
    o << R"({"question": "Q1?", "answer": "A", "context": [["T1", ["s1."]], ["T2", ["s2."]]]})"
      << "\n"
      << R"({"question": "Q2?", "answer": "B", "context": [["T2", ["s2."]], ["T3", ["s3."]]]})"
      << "\n";
  }
  const relokv_rag::text_codec codec{nullptr, 256};
  const auto w = relokv_rag::load_jsonl(path, 10, 1, codec);
  CHECK(w.requests.size() == 2);
  CHECK(w.corpus.size() == 3);  // T2 is shared
  CHECK(w.requests[1].passages.size() == 2);
  {
    std::ofstream o(path, std::ios::app);
    o << R"({"question": "Q3?", "answer": "C", "context": [["T4"]]})"
      << "\n";
  }
  CHECK_THROWS_WITH(relokv_rag::load_jsonl(path, 10, 1, codec), Catch::Contains(":3"));
  std::remove(path.c_str());
  const auto g = relokv_rag::generate(5, 12, 4, 1.0, 3, 512);
  CHECK(g.requests.size() == 5);
  for (const auto& r : g.requests) CHECK(r.passages.size() == 4);
}
