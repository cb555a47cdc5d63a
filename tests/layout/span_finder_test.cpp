// relokv::find_spans and relokv::span_index on a tokenizer of one byte per token: passages
// found whatever format joins them, remembered spans found again anywhere, per tenant, bounded.
// The same suite on the real models' tokenizers is in tests/server/chunker_test.cpp.
#include <relokv/layout/span_finder.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/prompt_formats.hpp"

namespace {

relokv_test::token_prompt bytes(const std::string& s) {
  relokv_test::token_prompt p{s, {}, {}};
  for (const char c : s) {
    p.ids.push_back(static_cast<unsigned char>(c));
    p.pieces.emplace_back(1, c);
  }
  return p;
}

/// What a chat template puts before the first message: the prefix (a forced cut ends it).
const std::string kOpening = "<|user|>\n";

using relokv_test::bytes_options;

std::vector<relokv::found_segment> find(const relokv_test::token_prompt& p,
                                        relokv::span_index* known = nullptr, std::uint64_t ns = 0) {
  const std::vector<std::int32_t> forced{
      p.text.starts_with(kOpening) ? static_cast<std::int32_t>(kOpening.size()) : 0};
  return relokv::find_spans(p.ids, p.pieces, bytes_options(), forced, known, ns);
}

std::string text(const relokv_test::token_prompt& p, const relokv::found_segment& s) {
  return p.text.substr(static_cast<std::size_t>(s.begin),
                       static_cast<std::size_t>(s.end - s.begin));
}

std::vector<std::string> spans(const relokv_test::token_prompt& p,
                               const std::vector<relokv::found_segment>& segs) {
  std::vector<std::string> out;
  for (const auto& s : segs)
    if (s.kind == relokv::found_kind::kSpan) out.push_back(text(p, s));
  return out;
}

std::vector<std::vector<std::int32_t>> span_tokens(const relokv_test::token_prompt& p,
                                                   const std::vector<relokv::found_segment>& segs) {
  std::vector<std::vector<std::int32_t>> out;
  for (const auto& s : segs)
    if (s.kind == relokv::found_kind::kSpan)
      out.emplace_back(p.ids.begin() + s.begin, p.ids.begin() + s.end);
  return out;
}

bool is_span(const relokv::found_segment& s) { return s.kind == relokv::found_kind::kSpan; }

const auto kPassages = relokv_test::test_passages();

std::vector<std::string> texts() {
  std::vector<std::string> out;
  for (const auto& [t, x] : kPassages) out.push_back(x);
  return out;
}

/// Two requests in format f: passages {0..5, 8, 9} in one order (8 and 9 of one sentence), then
/// {5..0, 6, 8, 9} in another. Every passage of the first is reused in the second, but for a
/// token at each end at most.
void check_reordered(const relokv_test::prompt_format& f, bool remember) {
  relokv::span_index known;
  const std::vector<std::size_t> o1 = {0, 1, 8, 2, 3, 4, 5, 9}, o2 = {5, 3, 9, 6, 1, 4, 0, 8, 2};
  const auto render = [&](const std::vector<std::size_t>& order, int request) {
    std::vector<std::pair<std::string, std::string>> ps;
    for (const std::size_t i : order) ps.push_back(kPassages[i]);
    return bytes(kOpening + relokv_test::render(f, ps, "Where was he born?", request));
  };
  const auto one = render(o1, 1);
  const auto s1 = find(one, remember ? &known : nullptr);
  const auto two = render(o2, 2);
  const auto s2 = find(two, remember ? &known : nullptr);
  INFO(two.text);
  for (const auto& r : relokv_test::reuse_of(two, s2, is_span, span_tokens(one, s1), texts())) {
    if (r.passage == 6) continue;  // new in the second request
    INFO("passage " << r.passage << ": " << r.reused << " of " << r.tokens);
    CHECK(r.reused >= r.tokens - 2);
  }
}

}  // namespace

TEST_CASE("span finder: every format of the suite reuses each passage in another order",
          "[layout]") {
  for (const auto& [name, f] : relokv_test::named_formats()) {
    INFO(name);
    check_reordered(f, false);
    check_reordered(f, true);
  }
}

TEST_CASE("span finder: labels that name a passage's place stay outside its span", "[layout]") {
  for (const std::string label :
       {"[3] ", "3. ", "(3) ", "Document 3: ", "Source #3 - ", "<document index=\"3\">", "- ",
        "\xE2\x80\xA2 ", "3) ", "{\"id\": 3, \"text\": \""}) {
    INFO(label);
    const std::string close = label.starts_with("<")   ? "</document>"
                              : label.starts_with("{") ? "\"}"
                                                       : "";
    const auto p = bytes("Sources:\n" + label + kPassages[0].second + close + "\n" + label +
                         kPassages[1].second + close + "\nQ?");
    const auto s = spans(p, find(p));
    CHECK(s == std::vector<std::string>{kPassages[0].second, kPassages[1].second});
  }
}

TEST_CASE("span finder: a title after an inline tag stays with its passage", "[layout]") {
  // <doc id="n">Title, then the text on the next line: the title joins the text (as a title on
  // a line of its own does), so the passage's span is the same in every order.
  const auto& [ta, a] = kPassages[0];
  const auto& [tb, b] = kPassages[1];
  const auto p = bytes(kOpening + "Documents: <doc id=\"1\">" + ta + "\n" + a +
                       "</doc> <doc id=\"2\">" + tb + "\n" + b + "</doc>\nQ?");
  CHECK(spans(p, find(p)) == std::vector<std::string>{ta + "\n" + a, tb + "\n" + b});
}

TEST_CASE("span finder: a passage seen once is found again inline, after text that changes",
          "[layout]") {
  relokv::span_index known;
  const std::string& a = kPassages[0].second;
  const std::string& b = kPassages[1].second;
  const auto first = bytes(kOpening + "Sources:\n" + a + "\n" + b + "\nQ?");
  CHECK(spans(first, find(first, &known)) == std::vector<std::string>{a, b});
  // No line break, no label: only the remembered spans cut this prompt.
  const auto later = bytes(kOpening + "Sources: in request 7, use " + b + " and then " + a + " Q?");
  const auto segs = find(later, &known);
  CHECK(spans(later, segs) == std::vector<std::string>{b, a});
  for (const auto& s : segs)
    if (is_span(s)) CHECK(s.remembered);
  // Without the index the rules find nothing to cut there.
  CHECK(spans(later, find(later)).empty());
}

TEST_CASE("span finder: a passage edited by one word is not cut as the old span", "[layout]") {
  relokv::span_index known;
  const std::string& a = kPassages[0].second;
  const auto direct = bytes(kOpening + "Sources:\n" + a + "\nQ?");
  REQUIRE(spans(direct, find(direct, &known)) == std::vector<std::string>{a});
  std::string edited = a;
  edited.replace(edited.find("forty"), 5, "fifty");
  const auto later = bytes(kOpening + "Sources: use " + edited + " then. Q?");
  for (const auto& s : find(later, &known)) {
    CHECK(text(later, s) != a);
    if (is_span(s)) CHECK(!s.remembered);
  }
  // The same edit on a line of its own is a span (new tokens: the cache computes it).
  const auto line = bytes(kOpening + "Sources:\n" + edited + "\nQ?");
  CHECK(spans(line, find(line, &known)) == std::vector<std::string>{edited});
}

TEST_CASE("span finder: one tenant's spans never cut another's prompt", "[layout]") {
  relokv::span_index known;
  const std::string& a = kPassages[2].second;
  const auto first = bytes(kOpening + "Sources:\n" + a + "\nQ?");
  (void)find(first, &known, /*ns=*/1);
  const auto later = bytes(kOpening + "Use " + a + " now. Q?");
  CHECK(spans(later, find(later, &known, 2)).empty());
  CHECK(spans(later, find(later, &known, 1)) == std::vector<std::string>{a});
}

TEST_CASE("span finder: the index holds at most its capacity", "[layout]") {
  relokv::span_index known(64);
  std::mt19937 rng(3);
  for (int i = 0; i < 500; ++i) {
    std::string line;
    for (int w = 0; w < 12; ++w)
      line += kPassages[rng() % kPassages.size()].first + (w % 4 == 3 ? ". " : " ");
    const auto p = bytes("S:\n" + line + "\nQ?");
    REQUIRE(spans(p, find(p, &known)).size() == 1);
  }
  CHECK(known.size() <= 64);
  CHECK(known.size() >= 32);
}

TEST_CASE("span finder: random formats reuse every passage seen before (property)", "[layout]") {
  std::mt19937 rng(20261206);
  for (int trial = 0; trial < 200; ++trial) {
    const auto f = relokv_test::random_format(rng);
    INFO("trial " << trial << " label '" << f.label << "' sep '" << f.sep << "' json " << f.json);
    check_reordered(f, trial % 2 == 0);
  }
}

TEST_CASE("span finder: segments tile the prompt; malformed text never throws", "[layout]") {
  std::mt19937 rng(7);
  const std::string alphabet = "ab <>[]\"\n\r\t:.-,{}#0123456789\\";
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int len = std::uniform_int_distribution<int>(0, 400)(rng);
    for (int i = 0; i < len; ++i)
      s += alphabet[std::uniform_int_distribution<std::size_t>(0, alphabet.size() - 1)(rng)];
    relokv::span_index known;
    const auto p = bytes(s);
    for (int pass = 0; pass < 2; ++pass) {
      relokv::span_finder_options o;
      o.min_span = 4;
      const auto segs = relokv::find_spans(p.ids, p.pieces, o, {}, &known);
      if (s.empty()) {
        CHECK(segs.empty());
        continue;
      }
      REQUIRE(!segs.empty());
      CHECK(segs.front().begin == 0);
      CHECK(segs.back().end == static_cast<std::int32_t>(s.size()));
      for (std::size_t i = 1; i < segs.size(); ++i) CHECK(segs[i].begin == segs[i - 1].end);
      for (const auto& g : segs) CHECK(g.begin < g.end);
    }
  }
}
