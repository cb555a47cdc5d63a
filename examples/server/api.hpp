#pragma once
// relokv_server's OpenAI-compatible surface: a chat completion request parsed and checked
// (every field of the wrong type or out of range is a 4xx naming it), the prompt built from
// the messages and the RAG documents, and the replies in OpenAI's JSON and chunk formats.
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <relokv/layout/builder.hpp>
#include <relokv/layout/request_layout.hpp>
#include <relokv/layout/span_finder.hpp>
#include <relokv/types.hpp>

#include "tokenizer.hpp"

namespace relokv_server {

/// A request the server refuses: the HTTP status and OpenAI's error object
/// ({"error": {"message", "type", "param", "code"}}).
struct api_error : std::runtime_error {
  api_error(int http_status, const std::string& message,
            std::string error_type = "invalid_request_error", std::string error_param = {},
            std::string error_code = {})
      : std::runtime_error(message),
        status(http_status),
        type(std::move(error_type)),
        param(std::move(error_param)),
        code(std::move(error_code)) {}
  int status;
  std::string type, param, code;
  [[nodiscard]] std::string body() const;
};

/// Containers a request may nest (the body's object is the first; a chat request needs 5).
inline constexpr int kMaxJsonDepth = 32;
/// Temperatures below this are served as greedy (0): the softmax at such a temperature is the
/// argmax, and its 1 / T would overflow.
inline constexpr double kGreedyTemperature = 1e-4;

/// What a request may ask for, as the server was started.
struct api_limits {
  std::int32_t context = 4096;      ///< prompt + max_tokens, in tokens
  std::int32_t max_documents = 32;  ///< entries of `documents`
  std::int32_t default_max_tokens = 256;
  std::int32_t max_messages = 256;
  std::int32_t block_size = 16;  ///< the engine's: documents start on block boundaries
  /// --links: the span-link adapter's rows every request with spans reads.
  std::optional<relokv::link_rows> links;
  /// --spans: where spans come from. kAuto: the `documents` field, or else chunks found in the
  /// message text (relokv/layout/span_finder.hpp); kDocuments: the `documents` field only; kOff:
  /// none (exact prefixes only).
  enum class span_source : std::uint8_t { kOff, kDocuments, kAuto } spans = span_source::kAuto;
  relokv::span_finder_options chunks;  ///< how --spans auto cuts
  /// The spans --spans auto has cut before, matched anywhere in later prompts (per tenant).
  /// Shared by every copy of the limits; null: rules only.
  std::shared_ptr<relokv::span_index> known_spans = std::make_shared<relokv::span_index>();
};

struct document {
  std::string id, title, text;
};

/// A chat completion request, checked.
struct chat_request {
  struct message {
    std::string role, content;
  };
  std::vector<message> messages;
  std::vector<document> documents;
  std::string model;
  std::int32_t max_tokens = 256;
  double temperature = 1.0;  ///< OpenAI's default; 0 is greedy
  double top_p = 1.0;
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage
  std::string strategy;        ///< relokv.strategy: a variant key, or empty (the server's)
};

/// Parses and checks a request body. @throws api_error (400) naming the field
chat_request parse_chat_request(const std::string& body, const api_limits& limits);

/// The prompt of a request in tokens, as a relokv layout: the system message (or the model's
/// default) and any earlier turns as the prefix, each document a relocatable span in the
/// order given, the last user message (with the assistant's opening) as the question. Without
/// documents the whole prompt is a prefix (exact hits only), or under --spans auto the chunks
/// found in it (relokv::find_spans: the same tokens, cut where passages end). `spans` false: one
/// prefix even with documents (the "prefix" variant). @throws api_error (400) for a prompt longer
/// than the context left by max_tokens
struct built_prompt {
  relokv::request_layout layout;
  std::vector<relokv::token_t> prefix, question;
  std::vector<std::vector<relokv::token_t>> documents;
  /// --spans auto without documents: the prompt (prefix then question) cut into chunks.
  std::vector<relokv::found_segment> chunks;
  bool spans = true;
  std::int32_t block_size = 16;
  std::optional<relokv::link_rows> links;  ///< read when the prompt has spans
  /// The layout of the prompt followed by `generated` (a preempted request's recompute: the
  /// answer so far continues the question).
  [[nodiscard]] relokv::request_layout with(const std::vector<relokv::token_t>& generated) const;
  /// Each span compiled alone behind the prefix (--compile-spans alone; as span-link rows
  /// were trained to read them, under the adapter's keys): a span still cached costs the
  /// plan's one token. Empty without spans.
  [[nodiscard]] std::vector<relokv::request_layout> compile_layouts() const;
};
/// `tenant`: the namespace of the spans --spans auto remembers (a tenant's salt: one tenant's
/// passages never decide where another's prompt is cut).
built_prompt build_prompt(const chat_request& r, const relokv_engine::tokenizer& tok,
                          const std::string& default_system, bool spans, const api_limits& limits,
                          std::uint64_t tenant = 0);

/// JSON text of `v` with any invalid UTF-8 in its strings replaced by U+FFFD: generated text
/// may end inside a character (max_tokens cuts a token sequence anywhere), and error messages
/// may quote the client's bytes. nlohmann's dump() would throw on either.
std::string to_text(const nlohmann::json& v);

/// Usage as OpenAI reports it, with the reused prompt tokens as cached_tokens.
nlohmann::json usage_json(std::int32_t prompt, std::int32_t completion, std::int32_t cached);

}  // namespace relokv_server
