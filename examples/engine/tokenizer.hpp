#pragma once
// The engine's tokenizers: GPT-2-style byte-level BPE read from a GGUF (what SmolLM2 and Qwen2
// use: the model's pre-tokenizer, encode, decode, special tokens), and `tokenizer`, which holds
// the model's own (BPE, or SentencePiece for Gemma 3) with its chat format.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <relokv/types.hpp>

#include "gguf.hpp"
#include "marked_text.hpp"
#include "spm_tokenizer.hpp"

namespace relokv_engine {

/// How text is cut into pieces before BPE (GGUF tokenizer.ggml.pre): GPT-2's pattern;
/// SmolLM2's (every digit alone, then GPT-2's); Qwen2's (single digits, newlines kept with
/// the punctuation before them, a non-letter may lead a word).
enum class pre_tokenizer : std::uint8_t { kGPT2, kSmolLM, kQwen2 };

/// Splits text into the pieces BPE runs on, as `pre` does (views into `text`). Bytes >= 0x80
/// are classified by the Unicode category of the code point they belong to; bytes that are not
/// valid UTF-8 count as punctuation, one each.
[[nodiscard]] std::vector<std::string_view> pre_tokenize(std::string_view text, pre_tokenizer pre);
/// The same pieces, handed to `piece` one at a time (memory: the text's code points only).
void pre_tokenize_each(std::string_view text, pre_tokenizer pre,
                       const std::function<void(std::string_view)>& piece);

class bpe_tokenizer {
 public:
  /// @throws gguf_error when the file has no (or an unsupported) tokenizer.
  explicit bpe_tokenizer(const gguf_file& f);
  /// From parts (tests, the synthetic model): byte-level token strings, "a b" merges, specials.
  bpe_tokenizer(std::vector<std::string> tokens, const std::vector<std::string>& merges,
                std::vector<std::string> specials, pre_tokenizer pre = pre_tokenizer::kGPT2);

  /// Text to ids; special tokens written literally in the text become their ids.
  [[nodiscard]] std::vector<relokv::token_t> encode(const std::string& text) const {
    return encode(text, nullptr);
  }
  /// Special tokens become their ids only where `text` marks a template piece.
  [[nodiscard]] std::vector<relokv::token_t> encode(const marked_text& text) const {
    return encode(text.str(), &text);
  }
  /// Ids to text (bytes); ids outside the vocabulary throw.
  [[nodiscard]] std::string decode(const std::vector<relokv::token_t>& ids) const;
  [[nodiscard]] std::int32_t vocab_size() const noexcept {
    return static_cast<std::int32_t>(tokens_.size());
  }
  /// The end-of-turn token of ChatML (<|im_end|>), or -1 when the vocabulary has none.
  [[nodiscard]] relokv::token_t end_of_turn() const { return id("<|im_end|>"); }
  /// Id of an exact token string, or -1.
  [[nodiscard]] relokv::token_t id(const std::string& token) const;

  /// ChatML as SmolLM2's template writes it: <|im_start|>role\ncontent<|im_end|>\n ...,
  /// ending with the assistant's opening.
  [[nodiscard]] static std::string chat(const std::string& system, const std::string& user);

 private:
  std::vector<relokv::token_t> encode(const std::string& text, const marked_text* marks) const;
  void build(const std::vector<std::string>& merges);
  void encode_word(std::string_view word, std::vector<relokv::token_t>& out) const;

  pre_tokenizer pre_ = pre_tokenizer::kGPT2;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, relokv::token_t> ids_;
  std::unordered_map<std::string, std::int32_t> ranks_;                 // "left right" -> rank
  std::vector<std::pair<std::string, relokv::token_t>> special_pairs_;  // longest first
  std::vector<std::uint8_t> is_special_;                                // per id
  std::string byte_sym_[256];  // byte -> its symbol (UTF-8)
  std::unordered_map<std::string, unsigned char> sym_byte_;
};

/// How a model's chat turns are written.
enum class chat_format : std::uint8_t {
  kChatML,  ///< <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen2)
  kGemma,   ///< <bos><start_of_turn>user\n...<end_of_turn>\n, the system folded into the user
  kPlain,   ///< a pretrained model's completion: "<bos>system\n\nuser\nAnswer:", ends at \n
};

/// The tokenizer a GGUF names (tokenizer.ggml.model "gpt2": byte-level BPE; "llama":
/// SentencePiece) and the chat format of its model. relokv runs no Jinja: where the file has a
/// tokenizer.chat_template, the format follows the vocabulary's markers (ChatML's, or Gemma's
/// turns), as those templates write them; a file without one is a pretrained model (Gemma 3
/// 270M's is google/gemma-3-270m), prompted as plain text that ends in "Answer:".
class tokenizer {
 public:
  /// @throws gguf_error when the file has no tokenizer relokv reads
  explicit tokenizer(const gguf_file& f);
  /// A BPE tokenizer with the ChatML format (tests, the synthetic model).
  explicit tokenizer(bpe_tokenizer bpe);

  /// Text to ids, special-token literals as control tokens (trusted text: the template's).
  [[nodiscard]] std::vector<relokv::token_t> encode(const std::string& text) const;
  /// Text to ids, control tokens only from the template's pieces (marked_text).
  [[nodiscard]] std::vector<relokv::token_t> encode(const marked_text& text) const;
  [[nodiscard]] std::string decode(const std::vector<relokv::token_t>& ids) const;
  [[nodiscard]] std::int32_t vocab_size() const noexcept;
  /// The longest token's bytes (a bound on the bytes one token can stand for).
  [[nodiscard]] std::size_t max_token_bytes() const noexcept { return max_token_bytes_; }
  [[nodiscard]] relokv::token_t id(const std::string& token) const;
  [[nodiscard]] chat_format format() const noexcept { return format_; }

  /// The text that ends a turn (<|im_end|> or <end_of_turn>), and its id (-1: none).
  [[nodiscard]] const std::string& end_of_turn_text() const noexcept { return eot_; }
  [[nodiscard]] relokv::token_t end_of_turn() const { return id(eot_); }
  /// An earlier turn of a conversation: role ("user" or "assistant") and content.
  using turn = std::pair<std::string, std::string>;
  /// The prompt up to the last user's words: ChatML's system turn, the earlier turns and the
  /// user's opening; Gemma's <bos>, the earlier turns and the user's opening, the system text
  /// (Gemma has no system role) leading the first user turn with a blank line after it.
  [[nodiscard]] std::string open(const std::string& system,
                                 const std::vector<turn>& history = {}) const {
    return open_marked(system, history).str();
  }
  /// The user's turn closed and the assistant's opened.
  [[nodiscard]] std::string close() const { return close_marked().str(); }
  /// open() with the system text and the turns' contents marked as plain text (a server's
  /// prompt: only the template's own literals become control tokens).
  [[nodiscard]] marked_text open_marked(const std::string& system,
                                        const std::vector<turn>& history = {}) const;
  [[nodiscard]] marked_text close_marked() const;
  /// open(system) + user + close(): a one-question prompt.
  [[nodiscard]] std::string chat(const std::string& system, const std::string& user) const {
    return open(system) + user + close();
  }
  /// The system message the model's chat template writes when a conversation has none (a
  /// literal of tokenizer.chat_template: SmolLM2's "You are a helpful AI assistant named
  /// SmolLM, ...", Qwen2.5's "You are Qwen, ..."); empty when the template has none.
  [[nodiscard]] const std::string& default_system() const noexcept { return default_system_; }
  /// Texts that end an answer (the end of turn, and the vocabulary's end of text).
  [[nodiscard]] std::vector<std::string> stop_texts() const;

 private:
  std::optional<bpe_tokenizer> bpe_;
  std::optional<spm_tokenizer> spm_;
  void measure();

  chat_format format_ = chat_format::kChatML;
  std::string eot_ = "<|im_end|>";
  std::size_t max_token_bytes_ = 1;
  std::string default_system_;
};

/// The default system message written as a literal in a ChatML chat template (Jinja): the
/// text between "<|im_start|>system\n" and "<|im_end|>" in a string literal that holds no
/// template code; empty when there is none.
[[nodiscard]] std::string template_default_system(const std::string& chat_template);

}  // namespace relokv_engine
