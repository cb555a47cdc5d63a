// relokv_server's request parsing and prompt building (api.hpp).
#include "api.hpp"

#include <cmath>
#include <limits>

#include <relokv/layout/builder.hpp>

namespace relokv_server {

using nlohmann::json;

std::string api_error::body() const {
  json e = {{"message", what()}, {"type", type}};
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return to_text(json{{"error", e}});
}

std::string to_text(const json& v) {
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw api_error(400, message, "invalid_request_error", param);
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "a value";
  }
}

const std::string& need_string(const json& v, const std::string& param) {
  if (!v.is_string()) bad(param, "'" + param + "' must be a string, not " + type_name(v));
  return v.get_ref<const std::string&>();
}

std::int64_t need_int(const json& v, const std::string& param, std::int64_t lo, std::int64_t hi) {
  if (!v.is_number_integer()) bad(param, "'" + param + "' must be an integer, not " + type_name(v));
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
    bad(param, "'" + param + "' must be at most " + std::to_string(hi));
  const auto x = v.get<std::int64_t>();
  if (x < lo || x > hi)
    bad(param, "'" + param + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                   "], not " + std::to_string(x));
  return x;
}

double need_number(const json& v, const std::string& param, double lo, double hi) {
  if (!v.is_number()) bad(param, "'" + param + "' must be a number, not " + type_name(v));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad(param,
        "'" + param + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

/// A message's content: a string, or OpenAI's array of parts of which only text is served.
std::string content_of(const json& c, const std::string& param) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(param, "'" + param + "' must be a string or an array of text parts");
  std::string out;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    const json& part = c[i];
    if (!part.is_object() || !part.contains("type"))
      bad(p, "'" + p + "' must be an object with a 'type'");
    const std::string& type = need_string(part["type"], p + ".type");
    if (type != "text") bad(p, "'" + p + "': only text parts are served, not '" + type + "'");
    if (!part.contains("text")) bad(p + ".text", "'" + p + ".text' is missing");
    out += need_string(part["text"], p + ".text");
  }
  return out;
}

}  // namespace

chat_request parse_chat_request(const std::string& body, const api_limits& limits) {
  json j;
  // The path of the value being parsed (object keys, "[]" for an array's elements), for the
  // error that names it; nesting is bounded before it costs memory.
  std::vector<std::string> path;
  const auto where = [&path] {
    std::string w;
    for (const std::string& k : path)
      w += k == "[]" ? k : k.empty() ? std::string() : (w.empty() ? "" : ".") + k;
    return w;
  };
  try {
    j = json::parse(body, [&](int, json::parse_event_t ev, json& parsed) {
      switch (ev) {
        case json::parse_event_t::object_start:
          path.emplace_back();
          break;
        case json::parse_event_t::array_start:
          path.emplace_back("[]");
          break;
        case json::parse_event_t::key:
          if (!path.empty()) path.back() = parsed.is_string() ? parsed.get<std::string>() : "";
          break;
        case json::parse_event_t::object_end:
        case json::parse_event_t::array_end:
          if (!path.empty()) path.pop_back();
          break;
        default:
          break;
      }
      // The containers open here (the body's object is the first): bounded as they open.
      if (path.size() > static_cast<std::size_t>(kMaxJsonDepth))
        throw api_error(400,
                        "the body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels",
                        "invalid_request_error", where(), "invalid_json");
      return true;
    });
  } catch (const api_error&) {
    throw;
  } catch (const json::out_of_range& e) {  // a number past double's range (1e999)
    const std::string w = where();
    throw api_error(
        400,
        (w.empty() ? std::string("a number") : "'" + w + "'") + " is out of range: " + e.what(),
        "invalid_request_error", w, "invalid_json");
  } catch (const json::exception& e) {
    throw api_error(400, std::string("the body is not valid JSON: ") + e.what(),
                    "invalid_request_error", {}, "invalid_json");
  }
  if (!j.is_object()) bad({}, std::string("the body must be a JSON object, not ") + type_name(j));
  chat_request r;
  r.max_tokens = limits.default_max_tokens;
  if (!j.contains("messages")) bad("messages", "'messages' is required");
  const json& ms = j["messages"];
  if (!ms.is_array() || ms.empty()) bad("messages", "'messages' must be a non-empty array");
  if (ms.size() > static_cast<std::size_t>(limits.max_messages))
    bad("messages", "at most " + std::to_string(limits.max_messages) + " messages");
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    const json& m = ms[i];
    if (!m.is_object()) bad(p, "'" + p + "' must be an object");
    if (!m.contains("role")) bad(p + ".role", "'" + p + ".role' is required");
    chat_request::message msg;
    msg.role = need_string(m["role"], p + ".role");
    if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for it
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant")
      bad(p + ".role",
          "'" + p + ".role' must be system, user or assistant, not '" + msg.role + "'");
    if (!m.contains("content") || m["content"].is_null())
      bad(p + ".content", "'" + p + ".content' is required");
    msg.content = content_of(m["content"], p + ".content");
    r.messages.push_back(std::move(msg));
  }
  if (r.messages.back().role != "user")
    bad("messages", "the last message must be the user's (the question)");
  if (j.contains("model") && !j["model"].is_null()) r.model = need_string(j["model"], "model");
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    if (j.contains(key) && !j[key].is_null())
      r.max_tokens = static_cast<std::int32_t>(need_int(j[key], key, 1, limits.context));
  if (j.contains("temperature") && !j["temperature"].is_null()) {
    r.temperature = need_number(j["temperature"], "temperature", 0.0, 2.0);
    // Below kGreedyTemperature the distribution is the argmax to double precision (and
    // 1 / T would overflow): served as greedy (docs/server.md).
    if (r.temperature < kGreedyTemperature) r.temperature = 0.0;
  }
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    r.top_p = need_number(j["top_p"], "top_p", 0.0, 1.0);
    if (r.top_p <= 0.0) bad("top_p", "'top_p' must be above 0");
  }
  if (j.contains("seed") && !j["seed"].is_null())
    r.seed = static_cast<std::uint64_t>(need_int(j["seed"], "seed",
                                                 std::numeric_limits<std::int64_t>::min(),
                                                 std::numeric_limits<std::int64_t>::max()));
  if (j.contains("n") && !j["n"].is_null() && need_int(j["n"], "n", 1, 1) != 1)
    bad("n", "'n' must be 1");
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > 4) bad("stop", "'stop' takes at most 4 sequences");
      for (std::size_t i = 0; i < s.size(); ++i)
        r.stop.push_back(need_string(s[i], "stop[" + std::to_string(i) + "]"));
    } else {
      bad("stop",
          std::string("'stop' must be a string or an array of strings, not ") + type_name(s));
    }
    for (const auto& x : r.stop)
      if (x.empty()) bad("stop", "'stop' sequences must not be empty");
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) bad("stream", "'stream' must be a boolean");
    r.stream = j["stream"].get<bool>();
  }
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const json& so = j["stream_options"];
    if (!so.is_object()) bad("stream_options", "'stream_options' must be an object");
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean())
        bad("stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (j.contains("documents") && !j["documents"].is_null()) {
    const json& ds = j["documents"];
    if (!ds.is_array()) bad("documents", "'documents' must be an array");
    if (ds.size() > static_cast<std::size_t>(limits.max_documents))
      bad("documents", "at most " + std::to_string(limits.max_documents) + " documents, not " +
                           std::to_string(ds.size()));
    for (std::size_t i = 0; i < ds.size(); ++i) {
      const std::string p = "documents[" + std::to_string(i) + "]";
      document d;
      if (ds[i].is_string()) {
        d.text = ds[i].get<std::string>();
      } else if (ds[i].is_object()) {
        if (!ds[i].contains("text")) bad(p + ".text", "'" + p + ".text' is required");
        d.text = need_string(ds[i]["text"], p + ".text");
        if (ds[i].contains("id") && !ds[i]["id"].is_null())
          d.id = ds[i]["id"].is_number_integer() ? to_text(ds[i]["id"])
                                                 : need_string(ds[i]["id"], p + ".id");
        if (ds[i].contains("title") && !ds[i]["title"].is_null())
          d.title = need_string(ds[i]["title"], p + ".title");
      } else {
        bad(p, "'" + p + "' must be a string or an object {id, title, text}");
      }
      if (d.text.empty()) bad(p, "'" + p + "' has no text");
      r.documents.push_back(std::move(d));
    }
  }
  if (j.contains("relokv") && !j["relokv"].is_null()) {
    const json& o = j["relokv"];
    if (!o.is_object()) bad("relokv", "'relokv' must be an object");
    if (o.contains("strategy")) r.strategy = need_string(o["strategy"], "relokv.strategy");
  }
  return r;
}

relokv::request_layout built_prompt::with(const std::vector<relokv::token_t>& generated) const {
  std::vector<relokv::token_t> q = question;
  q.insert(q.end(), generated.begin(), generated.end());
  relokv::layout_builder b(block_size);
  if (spans && !chunks.empty()) {
    // The prompt's own tokens, cut (the question chunk continues with what was generated).
    std::vector<relokv::token_t> all = prefix;
    all.insert(all.end(), q.begin(), q.end());
    if (links) b.links(*links);
    return relokv::add_found(b, all, chunks).build();
  }
  if (!spans || documents.empty()) {
    std::vector<relokv::token_t> all = prefix;
    for (const auto& d : documents) all.insert(all.end(), d.begin(), d.end());
    all.insert(all.end(), q.begin(), q.end());
    return b.prefix(all).build();
  }
  if (links) b.links(*links);
  b.prefix(prefix);
  for (const auto& d : documents) b.span(d);
  return b.question(q).build();
}

std::vector<relokv::request_layout> built_prompt::compile_layouts() const {
  std::vector<relokv::request_layout> out;
  if (!spans) return out;
  const auto alone = [&](std::span<const relokv::token_t> behind,
                         std::span<const relokv::token_t> span) {
    relokv::layout_builder b(block_size);
    if (links) b.links(*links);
    out.push_back(b.prefix(behind).span(span).build());
  };
  if (!chunks.empty()) {
    std::vector<relokv::token_t> all = prefix;
    all.insert(all.end(), question.begin(), question.end());
    const std::span<const relokv::token_t> t(all);
    const relokv::found_segment& first = chunks.front();
    for (const relokv::found_segment& k : chunks)
      if (k.kind == relokv::found_kind::kSpan)
        alone(t.subspan(0, static_cast<std::size_t>(first.end)),
              t.subspan(static_cast<std::size_t>(k.begin),
                        static_cast<std::size_t>(k.end - k.begin)));
    return out;
  }
  for (const auto& d : documents) alone(prefix, d);
  return out;
}

built_prompt build_prompt(const chat_request& r, const relokv_engine::tokenizer& tok,
                          const std::string& default_system, bool spans, const api_limits& limits,
                          std::uint64_t tenant) {
  std::string system = default_system;
  std::vector<relokv_engine::tokenizer::turn> history;
  std::size_t first = 0;
  if (r.messages.front().role == "system") {
    system = r.messages.front().content;
    first = 1;
  }
  for (std::size_t i = first; i + 1 < r.messages.size(); ++i)
    history.emplace_back(r.messages[i].role, r.messages[i].content);
  // Before any tokenizing: text that cannot fit the context whatever its tokens (a token
  // stands for at most max_token_bytes bytes) is refused by its size alone.
  std::size_t bytes = system.size() + r.messages.back().content.size();
  for (const auto& [role, content] : history) bytes += content.size();
  for (const document& d : r.documents) bytes += d.text.size() + d.title.size() + d.id.size();
  if (bytes / std::max<std::size_t>(tok.max_token_bytes(), 1) >
      static_cast<std::size_t>(limits.context))
    throw api_error(400,
                    "this request's text is " + std::to_string(bytes) +
                        " bytes: more tokens than the context of " +
                        std::to_string(limits.context) + " tokens whatever it says",
                    "invalid_request_error", "messages", "context_length_exceeded");
  built_prompt p;
  p.spans = spans && limits.spans != api_limits::span_source::kOff;
  p.block_size = limits.block_size;
  p.links = limits.links;
  // Only the template's own pieces make control tokens: a special token's literal in a
  // message or a document is tokenized as the text it spells (relokv_engine::marked_text).
  p.prefix = tok.encode(tok.open_marked(system, history));
  for (const document& d : r.documents) {
    const std::string& name = d.title.empty() ? d.id : d.title;
    relokv_engine::marked_text t;
    t.control("Document: ");
    if (!name.empty()) t.plain(name).control("\n");
    p.documents.push_back(tok.encode(t.plain(d.text).control("\n")));
  }
  relokv_engine::marked_text q;
  q.control(r.documents.empty() ? "" : "Question: ").plain(r.messages.back().content);
  p.question = tok.encode(q.append(tok.close_marked()));
  if (spans && r.documents.empty() && limits.spans == api_limits::span_source::kAuto) {
    // Spans found in the message text: cut in the prompt's own tokens.
    std::vector<relokv::token_t> all = p.prefix;
    all.insert(all.end(), p.question.begin(), p.question.end());
    std::vector<std::string> pieces;
    pieces.reserve(all.size());
    for (const relokv::token_t t : all) pieces.push_back(tok.decode({t}));
    // Every message's text starts a chunk (the template before the first is the prefix): the
    // line after each turn's opening token, and the last message's start. A conversation's
    // earlier turns are then cut the same way in every later request, so its passages meet
    // their own blocks again as exact hits.
    std::vector<std::int32_t> starts{static_cast<std::int32_t>(p.prefix.size())};
    for (const char* open : {"<|im_start|>", "<start_of_turn>"}) {
      const relokv::token_t turn = tok.id(open);
      if (turn < 0) continue;
      for (std::size_t i = 0; i < all.size(); ++i) {
        if (all[i] != turn) continue;
        std::size_t j = i + 1;
        while (j < all.size() && pieces[j].find('\n') == std::string::npos) ++j;
        if (j < all.size()) starts.push_back(static_cast<std::int32_t>(j + 1));
      }
    }
    p.chunks =
        relokv::find_spans(all, pieces, limits.chunks, starts, limits.known_spans.get(), tenant);
    if (p.chunks.size() < 2) p.chunks.clear();  // one prefix: nothing to relocate
  }
  p.layout = p.with({});
  const auto n = static_cast<std::int64_t>(p.layout.tokens.size());
  if (n + r.max_tokens > limits.context)
    throw api_error(400,
                    "this request needs " + std::to_string(n) + " prompt tokens and up to " +
                        std::to_string(r.max_tokens) + " completion tokens; the context is " +
                        std::to_string(limits.context) + " tokens",
                    "invalid_request_error", "messages", "context_length_exceeded");
  return p;
}

json usage_json(std::int32_t prompt, std::int32_t completion, std::int32_t cached) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

}  // namespace relokv_server
