// libFuzzer target: a tokenizer built from GGUF bytes (vocabulary, merges, token types), then
// encode/decode of arbitrary text. Input: le16 n, then n bytes of GGUF, then the text. A bad
// file is rejected with gguf_error (or invalid_argument for bad specials); text whose bytes the
// vocabulary cannot spell is a runtime_error; anything that encodes decodes back to itself.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf.hpp"
#include "tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  std::size_t n = data[0] | (std::size_t{data[1]} << 8);
  if (n > size - 2) n = size - 2;
  const std::vector<std::uint8_t> file(data + 2, data + 2 + n);
  const std::string text(reinterpret_cast<const char*>(data + 2 + n), size - 2 - n);
  try {
    const auto f = relokv_engine::gguf_file::from_memory(file);
    const relokv_engine::bpe_tokenizer tok(f);
    std::vector<relokv::token_t> ids;
    try {
      ids = tok.encode(text);
    } catch (const std::runtime_error&) {
      return 0;  // a byte with no token of its own
    }
    for (const auto id : ids)
      if (id < 0 || id >= tok.vocab_size()) std::abort();
    const std::string back = tok.decode(ids);
    if (back != text) {
      std::fprintf(stderr, "round trip: %zu bytes in, %zu out; ids:", text.size(), back.size());
      for (const auto id : ids) std::fprintf(stderr, " %d", id);
      std::fprintf(stderr, "\n");
      std::abort();
    }
  } catch (const relokv_engine::gguf_error&) {
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
