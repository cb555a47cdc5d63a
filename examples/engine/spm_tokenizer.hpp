#pragma once
// SentencePiece (BPE by piece scores) read from a GGUF whose tokenizer.ggml.model is "llama":
// Gemma 3's 262k vocabulary. Encoding as SentencePiece and llama.cpp do it: special and
// user-defined tokens are cut out of the text first (longest first), spaces become U+2581 (no
// dummy prefix unless tokenizer.ggml.add_space_prefix), then adjacent pieces merge, the pair
// whose merged piece scores highest first (the leftmost on ties), and a piece left outside the
// vocabulary falls back to its bytes (<0xXX> tokens).
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <relokv/types.hpp>

#include "gguf.hpp"
#include "marked_text.hpp"

namespace relokv_engine {

class spm_tokenizer {
 public:
  /// @throws gguf_error when the file has no SentencePiece vocabulary, or one without scores,
  ///         byte tokens or a consistent token_type array.
  explicit spm_tokenizer(const gguf_file& f);

  /// Text (UTF-8) to ids; control tokens written literally become their ids. No BOS is added:
  /// the chat format writes it (<bos>).
  [[nodiscard]] std::vector<relokv::token_t> encode(const std::string& text) const {
    return encode(text, nullptr);
  }
  /// Control tokens only where `text` marks a template piece (tokenizer.hpp's marked_text).
  [[nodiscard]] std::vector<relokv::token_t> encode(const marked_text& text) const;
  /// Ids to text: U+2581 back to spaces, byte tokens to their bytes, special tokens as written.
  /// @throws std::out_of_range for an id outside the vocabulary
  [[nodiscard]] std::string decode(const std::vector<relokv::token_t>& ids) const;
  [[nodiscard]] std::int32_t vocab_size() const noexcept {
    return static_cast<std::int32_t>(tokens_.size());
  }
  /// Id of an exact token string, or -1.
  [[nodiscard]] relokv::token_t id(const std::string& token) const;

 private:
  std::vector<relokv::token_t> encode(const std::string& text, const marked_text* marks) const;
  void encode_text(const std::string& text, std::vector<relokv::token_t>& out) const;

  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<std::int32_t> types_;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
  std::unordered_map<std::string, relokv::token_t> ids_;
  std::vector<std::pair<std::string, relokv::token_t>> specials_;  // longest first
  relokv::token_t byte_id_[256];
  bool space_prefix_ = false;
};

}  // namespace relokv_engine
