#include <relokv/layout/builder.hpp>
#include <relokv/layout/markers.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"

using relokv::layout_rule;
using relokv::token_t;

namespace {
relokv::marker_config config() {
  relokv::marker_config m;
  m.separator = 1000;
  m.dep_begin = 1001;
  m.dep_begin_last_n = 1002;
  m.dep_end = 1003;
  m.pad = 1004;
  m.vocab_size = 1000;
  m.block_size = 4;
  m.max_segment_tokens = 64;
  m.max_dep_window = 16;
  return m;
}
constexpr token_t SEP = 1000, DEP = 1001, DEPN = 1002, END = 1003, PAD = 1004;

layout_rule rule_of(const std::vector<token_t>& s, std::int64_t* offset = nullptr) {
  try {
    (void)relokv::parse_markers(s, config());
  } catch (const relokv::layout_error& e) {
    if (offset) *offset = e.offset();
    return e.rule();
  }
  FAIL("expected a layout_error");
  return layout_rule::kEmptyRequest;
}
}  // namespace

TEST_CASE("markers: spans start on block boundaries, padding takes no positions", "[layout]") {
  // prefix of 6, span of 5, question of 3
  const std::vector<token_t> s = {1, 2, 3, 4, 5, 6, SEP, 10, 11, 12, 13, 14, DEP, 20, 21, 22, END};
  const auto l = relokv::parse_markers(s, config());
  REQUIRE(l.tokens == std::vector<token_t>{1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 14, 20, 21, 22});
  REQUIRE(l.segments.size() == 3);
  CHECK(l.segments[0].kind == relokv::segment_kind::kPrefix);
  CHECK(l.segments[1].kind == relokv::segment_kind::kSpan);
  CHECK(l.segments[2].kind == relokv::segment_kind::kDependent);
  CHECK(l.segments[2].dep_window == 0);
  // blocks: [1..4] [5,6]+pad | [10..13] [14]+pad | [20,21,22] (open, last)
  REQUIRE(l.blocks.size() == 5);
  const std::vector<relokv::block_extent> expect = {
      {0, 4, 0, true}, {4, 2, 0, true}, {6, 4, 1, true}, {10, 1, 1, true}, {11, 3, 2, false}};
  CHECK(l.blocks == expect);
  CHECK(l.segments[1].first_block == 2);
  CHECK(l.segments[1].num_blocks == 2);
  CHECK(l.prefix_tokens().size() == 6);
}

TEST_CASE("markers and builder produce the same layout", "[layout]") {
  const std::vector<token_t> sys = {1, 2, 3}, a = {4, 5, 6, 7, 8}, b = {9}, q = {10, 11};
  std::vector<token_t> s(sys);
  s.push_back(SEP);
  s.insert(s.end(), a.begin(), a.end());
  s.push_back(SEP);
  s.insert(s.end(), b.begin(), b.end());
  s.push_back(DEPN);
  s.push_back(3);
  s.insert(s.end(), q.begin(), q.end());
  s.push_back(END);
  const auto from_markers = relokv::parse_markers(s, config());
  const auto from_builder =
      relokv::layout_builder(4, 1000, 64).prefix(sys).span(a).span(b).dependent(q, 3).build();
  CHECK(from_markers == from_builder);
  CHECK(from_markers.segments.back().dep_window == 3);

  // A question after a dependency in marker form equals builder's question().
  const std::vector<token_t> s2 = {1, 2, SEP, 3, 4, DEP, 5, END, 6, 7};
  const auto m2 = relokv::parse_markers(s2, config());
  const auto b2 = relokv::layout_builder(4, 1000, 64)
                      .prefix(std::vector<token_t>{1, 2})
                      .span(std::vector<token_t>{3, 4})
                      .dependent(std::vector<token_t>{5})
                      .question(std::vector<token_t>{6, 7})
                      .build();
  CHECK(m2 == b2);
}

TEST_CASE("markers: explicit padding seals a block inside a segment", "[layout]") {
  const auto l = relokv::parse_markers(std::vector<token_t>{1, 2, PAD, 3, 4, 5, 6, 7}, config());
  REQUIRE(l.blocks.size() == 3);
  CHECK(l.blocks[0].len == 2);
  CHECK(l.blocks[0].sealed);
  CHECK(l.blocks[1].len == 4);
  CHECK(l.blocks[1].sealed);  // full
  CHECK(l.blocks[2].len == 1);
  CHECK_FALSE(l.blocks[2].sealed);
  CHECK(l.segments.size() == 1);
}

TEST_CASE("layout: a request that ends with a span seals its last block", "[layout]") {
  // A document cached on its own must be reusable whole; a request ending in any other
  // segment leaves its last block open for decode.
  const std::vector<token_t> s = {1, 2, SEP, 3, 4, 5, 6, 7};
  const auto m = relokv::parse_markers(s, config());
  const auto b = relokv::layout_builder(4, 1000, 64)
                     .prefix(std::vector<token_t>{1, 2})
                     .span(std::vector<token_t>{3, 4, 5, 6, 7})
                     .build();
  CHECK(m == b);
  REQUIRE(b.blocks.size() == 3);
  CHECK(b.blocks[2].len == 1);
  CHECK(b.blocks[2].sealed);
  const auto q = relokv::layout_builder(4, 1000, 64)
                     .prefix(std::vector<token_t>{1, 2})
                     .question(std::vector<token_t>{3, 4, 5})
                     .build();
  CHECK_FALSE(q.blocks.back().sealed);
}

TEST_CASE("markers: malformed streams name the offset and the rule", "[layout]") {
  std::int64_t off = -1;
  CHECK(rule_of({1, 2, SEP}, &off) == layout_rule::kSeparatorAtEnd);
  CHECK(off == 2);
  CHECK(rule_of({1, SEP, SEP, 2}, &off) == layout_rule::kEmptySegment);
  CHECK(off == 2);
  CHECK(rule_of({1, DEP, 2, DEP, 3, END, END}, &off) == layout_rule::kNestedDependency);
  CHECK(off == 3);
  CHECK(rule_of({1, DEP, 2}, &off) == layout_rule::kUnterminatedDependency);
  CHECK(off == 3);
  CHECK(rule_of({1, END}, &off) == layout_rule::kUnmatchedDependencyEnd);
  CHECK(off == 1);
  CHECK(rule_of({1, 2, 1000000}, &off) == layout_rule::kTokenOutOfVocabulary);
  CHECK(off == 2);
  CHECK(rule_of({1, -7}, &off) == layout_rule::kTokenOutOfVocabulary);
  CHECK(rule_of({1, DEPN}) == layout_rule::kBadDependencyWindow);
  CHECK(rule_of({1, DEPN, 0, 2, END}) == layout_rule::kBadDependencyWindow);
  CHECK(rule_of({1, DEPN, 17, 2, END}) == layout_rule::kBadDependencyWindow);
  CHECK(rule_of({1, DEP, 2, SEP, 3, END}) == layout_rule::kSeparatorInDependency);
  CHECK(rule_of({1, DEP, END}) == layout_rule::kEmptySegment);
  CHECK(rule_of({}) == layout_rule::kEmptyRequest);
  CHECK(rule_of({PAD}) == layout_rule::kEmptyRequest);
  std::vector<token_t> longspan = {1, SEP};
  longspan.resize(2 + 65, 5);
  CHECK(rule_of(longspan, &off) == layout_rule::kSpanTooLong);
  CHECK(off == 2 + 64);
}

TEST_CASE("markers: the error message says where and why", "[layout]") {
  try {
    (void)relokv::parse_markers(std::vector<token_t>{1, 2, SEP}, config());
    FAIL("no error");
  } catch (const relokv::layout_error& e) {
    const std::string what = e.what();
    CHECK(what.find("offset 2") != std::string::npos);
    CHECK(what.find("separator") != std::string::npos);
  }
}

TEST_CASE("markers: bad configurations are rejected", "[layout]") {
  auto m = config();
  m.dep_end = m.separator;
  CHECK_THROWS_AS(relokv::parse_markers(std::vector<token_t>{1}, m), relokv::layout_error);
  m = config();
  m.block_size = 12;
  CHECK_THROWS_AS(relokv::parse_markers(std::vector<token_t>{1}, m), relokv::layout_error);
  m = config();
  m.dep_end = relokv::marker_config::kNoMarker;
  CHECK_THROWS_AS(relokv::parse_markers(std::vector<token_t>{1}, m), relokv::layout_error);
}

TEST_CASE("builder: order and emptiness are checked", "[layout]") {
  const std::vector<token_t> t = {1, 2};
  relokv::layout_builder b(4);
  b.span(t);
  CHECK_THROWS_AS(b.prefix(t), relokv::layout_error);
  relokv::layout_builder q(4);
  q.question(t);
  CHECK_THROWS_AS(q.span(t), relokv::layout_error);
  CHECK_THROWS_AS(relokv::layout_builder(4).span(std::vector<token_t>{}).build(),
                  relokv::layout_error);
  CHECK_THROWS_AS(relokv::layout_builder(4).build(), relokv::layout_error);
  CHECK_THROWS_AS(relokv::layout_builder(4, 10).span(std::vector<token_t>{10}).build(),
                  relokv::layout_error);
}

TEST_CASE("layout: a stream without markers is one prefix", "[layout]") {
  std::vector<token_t> s(10);
  for (int i = 0; i < 10; ++i) s[static_cast<std::size_t>(i)] = i;
  const auto l = relokv::parse_markers(s, config());
  REQUIRE(l.segments.size() == 1);
  CHECK(l.segments[0].kind == relokv::segment_kind::kPrefix);
  CHECK(l.num_blocks() == 3);
  CHECK(l.blocks[2].pos0 == 8);
  CHECK(l.block_tokens(2).size() == 2);
}

TEST_CASE("markers: padding after a span or a dependency is padding, alike", "[layout]") {
  // Both end with a closed segment followed by PAD: neither opens an empty segment.
  const auto after_span = relokv::parse_markers(std::vector<token_t>{1, SEP, 2, PAD}, config());
  const auto after_dep = relokv::parse_markers(std::vector<token_t>{1, DEP, 2, END, PAD}, config());
  CHECK(after_span.segments.size() == 2);
  CHECK(after_dep.segments.size() == 2);
  // A question after padding still binds to everything before it.
  const auto q = relokv::parse_markers(std::vector<token_t>{1, DEP, 2, END, PAD, 3}, config());
  REQUIRE(q.segments.size() == 3);
  CHECK(q.segments[2].kind == relokv::segment_kind::kDependent);
  CHECK(q.segments[2].dep_window == 0);
  // A marker that opens a segment with no token after it is still an empty segment.
  CHECK(rule_of({1, SEP, PAD}) == layout_rule::kEmptySegment);
  CHECK(rule_of({1, DEP, PAD, END}) == layout_rule::kEmptySegment);
}

TEST_CASE("layout: windows and block sizes have upper bounds", "[layout]") {
  const std::vector<token_t> t = {1, 2, 3};
  // Windows 5 and 2^23 + 5 would share a segment tag: the largest window is kMaxDepWindow.
  CHECK_NOTHROW(relokv::layout_builder(4).prefix(t).dependent(t, relokv::kMaxDepWindow).build());
  try {
    (void)relokv::layout_builder(4).prefix(t).dependent(t, (1 << 23) + 5);
    FAIL("no error");
  } catch (const relokv::layout_error& e) {
    CHECK(e.rule() == layout_rule::kBadDependencyWindow);
    CHECK(std::string(e.what()).find("8388613") != std::string::npos);
  }
  auto cfg = config();
  cfg.max_dep_window = relokv::kMaxDepWindow + 1;
  CHECK_THROWS_AS(relokv::parse_markers(std::vector<token_t>{1}, cfg), relokv::layout_error);
  CHECK_THROWS_AS(relokv::layout_builder(1 << 30).prefix(t).build(), relokv::layout_error);
  CHECK_NOTHROW(relokv::layout_builder(relokv::kMaxBlockSize).prefix(t).build());
}

namespace {
/// The rule and message of check_layout for a layout, or kEmptyRequest and "" when it passes.
std::string layout_complaint(const relokv::request_layout& l) {
  try {
    relokv::check_layout(l);
  } catch (const relokv::layout_error& e) {
    CHECK(e.rule() == layout_rule::kMalformedLayout);
    return e.what();
  }
  return {};
}
}  // namespace

TEST_CASE("layout: check_layout rejects what only a hand-built layout can hold", "[layout]") {
  const std::vector<token_t> p = {1, 2, 3, 4, 5}, s = {6, 7, 8}, q = {9};
  const auto good = relokv::layout_builder(4).prefix(p).span(s).question(q).build();
  CHECK(layout_complaint(good).empty());
  auto has = [](const std::string& msg, const char* field) {
    INFO(msg);
    return msg.find(field) != std::string::npos;
  };
  auto l = good;
  l.blocks[0].len = 9;  // would overwrite the stored tokens of the next block
  CHECK(has(layout_complaint(l), "blocks[0].len"));
  l = good;
  l.blocks[2].pos0 = 100;
  CHECK(has(layout_complaint(l), "blocks[2].pos0"));
  l = good;
  l.blocks[1].segment = 7;
  CHECK(has(layout_complaint(l), "blocks[1].segment"));
  l = good;
  l.tokens[3] = -4;
  CHECK(has(layout_complaint(l), "tokens[3]"));
  l = good;
  l.segments.clear();
  l.blocks.clear();
  CHECK(has(layout_complaint(l), "segments is empty"));
  l = relokv::request_layout{};
  CHECK(has(layout_complaint(l), "tokens is empty"));
  l = good;
  l.segments[1].first_block = 0;
  CHECK(has(layout_complaint(l), "segments[1].first_block"));
  l = good;
  l.segments[1].dep_window = 3;  // a span has no window
  CHECK(has(layout_complaint(l), "segments[1].dep_window"));
  l = good;
  l.segments[2].num_blocks = 5;
  CHECK(has(layout_complaint(l), "segments[2].num_blocks"));
  l = good;
  l.blocks[0].sealed = false;
  CHECK(has(layout_complaint(l), "blocks[0].sealed"));
  l = good;
  l.tokens.push_back(3);
  CHECK(has(layout_complaint(l), "tokens holds"));
  l = good;
  l.block_size = 3;
  CHECK(has(layout_complaint(l), "block_size"));
}
