// Reference token ids for the SentencePiece tokenizer parity test, from llama.cpp's own
// tokenizer (an implementation that shares no code with relokv's): every string of
// tests/engine/data/tokenizer_strings.txt (one JSON string per line, decoded by the small
// reader below) tokenized with special-token parsing on and nothing added, one line per string:
// the model name, a tab, the ids. Appended by hand to tests/engine/data/tokenizer_ref_ids.tsv;
// the C++ test needs neither llama.cpp nor this program.
//
//   L=~/.cache/relokv/llama.cpp/0.3.36-*   (what scripts/get-llama-cpp builds)
//   g++ -std=c++17 -I$L/include tests/reference/spm_tokenizer_ref.cpp -L$L/lib -lllama \
//       -Wl,-rpath,$L/lib -o /tmp/spm_ref
//   /tmp/spm_ref gemma3-270m ~/.cache/relokv/gemma-3-270m-q4_k_m.gguf \
//       < tests/engine/data/tokenizer_strings.txt >> tests/engine/data/tokenizer_ref_ids.tsv
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "llama.h"

namespace {
void put_utf8(std::string& out, unsigned cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}
// One JSON string literal (the file's lines), escapes and surrogate pairs included.
std::string json_string(const std::string& line) {
  std::string out;
  for (std::size_t i = 1; i + 1 < line.size(); ++i) {
    if (line[i] != '\\') {
      out += line[i];
      continue;
    }
    const char e = line[++i];
    if (e == 'n')
      out += '\n';
    else if (e == 't')
      out += '\t';
    else if (e == 'r')
      out += '\r';
    else if (e == 'u') {
      unsigned cp = std::stoul(line.substr(i + 1, 4), nullptr, 16);
      i += 4;
      if (cp >= 0xD800 && cp < 0xDC00 && line.compare(i + 1, 2, "\\u") == 0) {
        const unsigned lo = std::stoul(line.substr(i + 3, 4), nullptr, 16);
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        i += 6;
      }
      put_utf8(out, cp);
    } else {
      out += e;
    }
  }
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s NAME MODEL.gguf < strings.txt\n", argv[0]);
    return 2;
  }
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[2], mp);
  if (model == nullptr) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    const std::string text = json_string(line);
    std::vector<llama_token> ids(text.size() + 16);
    const int n = llama_tokenize(vocab, text.data(), static_cast<int>(text.size()), ids.data(),
                                 static_cast<int>(ids.size()), /*add_special=*/false,
                                 /*parse_special=*/true);
    if (n < 0) return 1;
    std::printf("%s\t", argv[1]);
    for (int i = 0; i < n; ++i) std::printf(i ? " %d" : "%d", ids[static_cast<std::size_t>(i)]);
    std::printf("\n");
  }
  llama_model_free(model);
  return 0;
}
