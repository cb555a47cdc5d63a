#pragma once
// Plain RAG prompts as clients join their passages: the named formats of the span-finding
// suite (bench/plain_prompt_reuse sends the same ones to the server) and a seeded generator
// of formats (separators, labels, indentation, closings) for the property tests.
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <relokv/layout/span_finder.hpp>

namespace relokv_test {

/// How a prompt joins its passages. `label` and `close` may hold "%d": the passage's place
/// (1-based) in this prompt.
struct prompt_format {
  std::string intro;                     ///< before the passages ("%d": the request's number)
  std::string label;                     ///< before each passage
  std::string indent;                    ///< before the label
  std::string close;                     ///< after each passage
  std::string sep = "\n\n";              ///< between passages
  std::string outro = "\n\nQuestion: ";  ///< between the last passage and the question
  bool titles = false;                   ///< each passage's title on a line of its own first
  bool json = false;                     ///< a JSON array of strings (label, close, sep ignored)
  bool crlf = false;                     ///< every "\n" written "\r\n"
};

inline std::string place(std::string s, int i) {
  for (std::size_t at = s.find("%d"); at != std::string::npos; at = s.find("%d"))
    s.replace(at, 2, std::to_string(i));
  return s;
}

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

/// The prompt: `passages` as {title, text} in the order given, then the question.
inline std::string render(const prompt_format& f,
                          const std::vector<std::pair<std::string, std::string>>& passages,
                          const std::string& question, int request = 1) {
  std::string out = place(f.intro, request);
  if (f.json) {
    out += "[";
    for (std::size_t i = 0; i < passages.size(); ++i)
      out += (i ? ", " : "") + json_string(f.titles ? passages[i].first + "\n" + passages[i].second
                                                    : passages[i].second);
    out += "]";
  } else {
    for (std::size_t i = 0; i < passages.size(); ++i) {
      const int at = static_cast<int>(i) + 1;
      if (i) out += f.sep;
      out += f.indent + place(f.label, at);
      if (f.titles) out += passages[i].first + "\n" + f.indent;
      out += passages[i].second + place(f.close, at);
    }
  }
  out += f.outro + question;
  if (f.crlf) {
    std::string c;
    for (const char ch : out) c += ch == '\n' ? std::string("\r\n") : std::string(1, ch);
    out = c;
  }
  return out;
}

/// The suite's formats, by name: what the frameworks send and what operators meet.
inline std::vector<std::pair<std::string, prompt_format>> named_formats() {
  std::vector<std::pair<std::string, prompt_format>> v;
  const auto add = [&](const char* name, auto&& set) {
    prompt_format f;
    set(f);
    v.emplace_back(name, f);
  };
  add("langchain", [](prompt_format& f) {
    f.intro =
        "Use the following pieces of context to answer the question at the end. If you "
        "don't know the answer, just say that you don't know.\n\n";
    f.titles = true;
  });
  add("llamaindex", [](prompt_format& f) {
    f.intro = "Context information is below.\n---------------------\n";
    f.outro =
        "\n---------------------\nGiven the context information and not prior knowledge, "
        "answer the query.\nQuery: ";
    f.titles = true;
  });
  add("markdown", [](prompt_format& f) {
    f.intro = "## Sources\n";
    f.label = "- ";
    f.sep = "\n";
  });
  add("one_a_line", [](prompt_format& f) {
    f.intro = "Answer using these passages.\n";
    f.sep = "\n";
    f.outro = "\n";
  });
  add("haystack", [](prompt_format& f) {
    f.intro = "Given the context please answer the question.\nContext:\n";
    f.indent = "    ";
    f.sep = "\n";
    f.outro = "\nQuestion: ";
  });
  add("xml", [](prompt_format& f) {
    f.intro = "<documents>\n";
    f.label = "<document index=\"%d\">\n";
    f.close = "\n</document>";
    f.sep = "\n";
    f.outro = "\n</documents>\n\n";
  });
  add("xml_inline", [](prompt_format& f) {
    f.intro = "Documents: ";
    f.label = "<doc id=\"%d\">";
    f.close = "</doc>";
    f.sep = " ";
    f.outro = "\nQuestion: ";
  });
  add("numbered", [](prompt_format& f) {
    f.intro = "Cite the sources you use as [n].\n\n";
    f.label = "[%d] ";
    f.sep = "\n";
  });
  add("document_n", [](prompt_format& f) { f.label = "Document %d: "; });
  add("json", [](prompt_format& f) {
    f.intro = "Context (JSON): ";
    f.outro = "\nQuestion: ";
    f.json = true;
  });
  add("titled", [](prompt_format& f) {
    f.intro = "Read the articles below.\n\n";
    f.titles = true;
  });
  add("crlf", [](prompt_format& f) {
    f.intro = "Sources:\n";
    f.label = "%d. ";
    f.sep = "\n";
    f.crlf = true;
  });
  add("changing_intro",
      [](prompt_format& f) { f.intro = "Request %d: answer from the passages below only.\n"; });
  return v;
}

/// A format drawn at random: separators, labels, indentation, closings, titles, line ends.
inline prompt_format random_format(std::mt19937& rng) {
  const auto pick = [&](const std::vector<std::string>& v) {
    return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
  };
  prompt_format f;
  f.intro = pick({"", "Context:\n", "Request %d. Use these sources.\n", "Sources\n=====\n",
                  "Answer from the passages below.\n\n", "<context>\n"});
  f.label = pick({"", "[%d] ", "%d. ", "(%d) ", "Document %d: ", "Source #%d - ", "<doc id=\"%d\">",
                  "- ", "* ", "%d) ", "<passage index=\"%d\">\n"});
  f.close = f.label.starts_with("<") ? pick({"</doc>", "\n</passage>", ""}) : std::string();
  f.indent = pick({"", "", "  ", "    ", "\t"});
  f.sep = pick({"\n", "\n\n", "\n\n\n", "\n---\n", "\n\n***\n\n"});
  f.outro = pick({"\n\nQuestion: ", "\nQ: ", "\n---\nGiven the context, answer: "});
  f.titles = std::uniform_int_distribution<int>(0, 3)(rng) == 0;
  f.json = std::uniform_int_distribution<int>(0, 9)(rng) == 0;
  f.crlf = std::uniform_int_distribution<int>(0, 5)(rng) == 0;
  return f;
}

/// Eight passages of 40-50 words, then two of one sentence (8 and 9: 17-25 tokens with their
/// titles on the three tokenizers): all long enough to be spans on any tokenizer (min_span 16).
inline std::vector<std::pair<std::string, std::string>> test_passages() {
  return {
      {"Skerry Point Lighthouse",
       "The lighthouse on Skerry Point was built in 1852 by the engineer Alan Brodie. It stands "
       "forty metres tall, and its light is seen for twenty miles on a clear night; it was "
       "automated in 1989 and is now a museum of the coast guard."},
      {"Carrick",
       "Carrick is a fishing town on the west coast; its school dates from 1870. The "
       "harbour holds sixty boats, most of them crab and lobster boats that sail "
       "before dawn and land their catch by noon."},
      {"Alan Brodie",
       "Alan Brodie was born in Leith in 1811 and died in Carrick in 1879. His "
       "notebooks, with drawings of every harbour wall he built, are kept in the "
       "town library and were printed in 1960."},
      {"Mara Velde",
       "Mara Velde is a Dutch composer who wrote three operas about the sea. Her "
       "second opera, The Tide Clock, opened in Rotterdam in 2004 and toured "
       "eleven cities before it was recorded in Vienna."},
      {"The Tide Clock",
       "The Tide Clock is an opera in two acts set in a harbour town where the "
       "clocks follow the tides instead of the sun. Its libretto is by the poet "
       "Jan Oort, who also wrote the words of its famous storm chorus."},
      {"Jan Oort (poet)",
       "Jan Oort is a poet from Groningen whose collections sing of dikes, "
       "canals and winter light. He taught literature at the university "
       "there for thirty years and translated Homer into Dutch verse."},
      {"Leith",
       "Leith is a port district to the north of Edinburgh at the mouth of the Water "
       "of Leith. It was a burgh of its own until 1920 and its docks once built the "
       "ships that sailed to the Baltic and to Greenland."},
      {"Groningen",
       "Groningen is the largest city in the north of the Netherlands and home to "
       "a university founded in 1614. Its tower, the Martinitoren, is ninety-seven "
       "metres tall and has a carillon of sixty-two bells."},
      {"Brodie Pier",
       "Brodie Pier is a stone pier in Carrick, finished in 1848 and rebuilt after 1953."},
      {"Oort Prize", "The Oort Prize is a Dutch award for poems about water, given since 1990."},
  };
}

/// The finder's options for a tokenizer of one byte a token: four times a real tokenizer's
/// count, so four times its minimum span (a label such as `<document index="3">` is 20 bytes,
/// 7 tokens on SmolLM2's tokenizer).
inline relokv::span_finder_options bytes_options() {
  relokv::span_finder_options o;
  o.min_span *= 4;
  return o;
}

/// A prompt in tokens: ids and the bytes each stands for.
struct token_prompt {
  std::string text;
  std::vector<std::int32_t> ids;
  std::vector<std::string> pieces;
};

/// Per passage of `passages` found in `p` (its text's bytes in the prompt), how many of its
/// tokens lie in a span of `spans` (segments of `p`) whose tokens were a span before (`seen`),
/// and how many tokens it has. Passages absent from the text are skipped.
struct passage_reuse {
  std::size_t passage;
  std::int32_t reused, tokens;
};
template <class Segment, class IsSpan>
std::vector<passage_reuse> reuse_of(const token_prompt& p, const std::vector<Segment>& segs,
                                    IsSpan is_span,
                                    const std::vector<std::vector<std::int32_t>>& seen,
                                    const std::vector<std::string>& passages) {
  std::vector<std::size_t> off{0};
  for (const auto& piece : p.pieces) off.push_back(off.back() + piece.size());
  std::vector<bool> reused(p.ids.size(), false);
  for (const auto& s : segs) {
    if (!is_span(s)) continue;
    const std::vector<std::int32_t> t(p.ids.begin() + s.begin, p.ids.begin() + s.end);
    for (const auto& old : seen)
      if (old == t) {
        for (auto i = s.begin; i < s.end; ++i) reused[static_cast<std::size_t>(i)] = true;
        break;
      }
  }
  std::vector<passage_reuse> out;
  for (std::size_t k = 0; k < passages.size(); ++k) {
    const std::size_t at = p.text.find(passages[k]);
    if (at == std::string::npos) continue;
    passage_reuse r{k, 0, 0};
    for (std::size_t i = 0; i < p.ids.size(); ++i) {
      if (off[i] < at || off[i + 1] > at + passages[k].size()) continue;
      ++r.tokens;
      r.reused += reused[i] ? 1 : 0;
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace relokv_test
