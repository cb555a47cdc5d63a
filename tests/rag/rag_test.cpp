#include "rag.hpp"

#include <cstdio>
#include <fstream>
#include <string>

#include "json.hpp"
#include "support/catch.hpp"

TEST_CASE("rag: the JSON reader", "[rag]") {
  const auto j = relokv_rag::json::parse(
      R"({"q": "caf\u00e9 \"x\"", "n": -1.5e2, "a": [true, false, null, ["t", ["s1", "s2"]]]})",
      "line");
  CHECK(j.at("q").str == "café \"x\"");
  CHECK(j.at("n").num == -150.0);
  CHECK(j.at("a").arr.size() == 4);
  CHECK(j.at("a").arr[3].arr[1].arr[1].str == "s2");
  CHECK_THROWS_WITH(relokv_rag::json::parse(R"({"a": [1, 2)", "f.jsonl:3"),
                    Catch::Contains("f.jsonl:3"));
  CHECK_THROWS(relokv_rag::json::parse(R"({"a" 1})", "x"));
  CHECK_THROWS(relokv_rag::json::parse(R"("open)", "x"));
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
