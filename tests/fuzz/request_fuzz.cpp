// libFuzzer target: relokv_server's request parser and prompt builder. Any bytes are either
// refused with an api_error of status 4xx (the server's 400s, never a 500) or give a request
// whose prompt is built within the context, with control tokens only where the template put
// them.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "api.hpp"
#include "tokenizer.hpp"

namespace {

void check(bool cond) {
  if (!cond) std::abort();
}

const relokv_engine::tokenizer& tok() {
  // Bytes a..z, space, newline and the literal's bytes, with <|im_start|> and <|im_end|>
  // special: every text the fuzzer writes that stays in this alphabet tokenizes; other bytes
  // make encode throw std::runtime_error, which the prompt builder does not catch, so they are
  // filtered below.
  static const relokv_engine::tokenizer t = [] {
    std::vector<std::string> v = {"<|im_start|>", "<|im_end|>"};
    for (char c = 'a'; c <= 'z'; ++c) v.emplace_back(1, c);
    for (const char* s : {"<", "|", "_", ">", ":", "\xc4\xa0", "\xc4\x8a", "D", "Q", "A"})
      v.emplace_back(s);
    return relokv_engine::tokenizer(relokv_engine::bpe_tokenizer(v, {}, {v[0], v[1]}));
  }();
  return t;
}

bool in_alphabet(const std::string& s) {
  for (const char c : s)
    if (!((c >= 'a' && c <= 'z') || c == ' ' || c == '\n' || c == '<' || c == '|' || c == '_' ||
          c == '>' || c == ':'))
      return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  relokv_server::api_limits lim;
  lim.context = 512;
  lim.max_documents = 8;
  relokv_server::chat_request r;
  try {
    r = relokv_server::parse_chat_request(body, lim);
  } catch (const relokv_server::api_error& e) {
    check(e.status >= 400 && e.status < 500);
    return 0;
  }
  // What parsing promises: a user's last message, bounds kept, finite numbers.
  check(!r.messages.empty() && r.messages.back().role == "user");
  check(r.max_tokens >= 1 && r.max_tokens <= lim.context);
  check(r.temperature == 0.0 ||
        (r.temperature >= relokv_server::kGreedyTemperature && r.temperature <= 2.0));
  check(r.top_p > 0.0 && r.top_p <= 1.0);
  check(r.documents.size() <= static_cast<std::size_t>(lim.max_documents));
  bool plain = true;
  for (const auto& m : r.messages) plain = plain && in_alphabet(m.content);
  for (const auto& d : r.documents)
    plain = plain && in_alphabet(d.text) && in_alphabet(d.title) && in_alphabet(d.id);
  if (!plain) return 0;
  try {
    const auto p = relokv_server::build_prompt(r, tok(), "sys", true, lim);
    check(static_cast<std::int64_t>(p.layout.tokens.size()) + r.max_tokens <= lim.context);
    // Control tokens: only the template's (ChatML: system, earlier turns, user, assistant).
    std::size_t control = 0;
    for (const auto t : p.layout.tokens) control += t == 0 || t == 1;
    std::size_t turns = 0;
    for (std::size_t i = 0; i + 1 < r.messages.size(); ++i)
      turns += r.messages[i].role != "system" || i > 0;
    check(control == 2 * (turns + 3) - 1);
  } catch (const relokv_server::api_error& e) {
    check(e.status == 400);
  }
  return 0;
}
