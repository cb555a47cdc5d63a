#pragma once
// GPT-2-style byte-level BPE read from a GGUF (what SmolLM2 uses): encode, decode, special
// tokens and the chat template's role markers.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <relokv/types.hpp>

#include "gguf.hpp"

namespace relokv_engine {

class bpe_tokenizer {
 public:
  /// @throws gguf_error when the file has no (or an unsupported) tokenizer.
  explicit bpe_tokenizer(const gguf_file& f);
  /// From parts (tests, the synthetic model): byte-level token strings, "a b" merges, specials.
  bpe_tokenizer(std::vector<std::string> tokens, const std::vector<std::string>& merges,
                std::vector<std::string> specials);

  /// Text to ids; special tokens written literally in the text become their ids.
  [[nodiscard]] std::vector<relokv::token_t> encode(const std::string& text) const;
  /// Ids to text (bytes); ids outside the vocabulary throw.
  [[nodiscard]] std::string decode(const std::vector<relokv::token_t>& ids) const;
  [[nodiscard]] std::int32_t vocab_size() const noexcept {
    return static_cast<std::int32_t>(tokens_.size());
  }
  /// Id of an exact token string, or -1.
  [[nodiscard]] relokv::token_t id(const std::string& token) const;

  /// ChatML as SmolLM2's template writes it: <|im_start|>role\ncontent<|im_end|>\n ...,
  /// ending with the assistant's opening.
  [[nodiscard]] static std::string chat(const std::string& system, const std::string& user);

 private:
  void build(const std::vector<std::string>& merges);
  void encode_word(const std::string& word, std::vector<relokv::token_t>& out) const;

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, relokv::token_t> ids_;
  std::unordered_map<std::string, std::int32_t> ranks_;                 // "left right" -> rank
  std::vector<std::pair<std::string, relokv::token_t>> special_pairs_;  // longest first
  std::vector<std::uint8_t> is_special_;                                // per id
  std::string byte_sym_[256];  // byte -> its symbol (UTF-8)
  std::unordered_map<std::string, unsigned char> sym_byte_;
};

}  // namespace relokv_engine
