// What the llama.cpp adapter reads of a model (model_info.hpp).
#include "model_info.hpp"

#include <llama.h>
#include <relokv/hash/xxh3.hpp>  // XXH3, inlined as relokv uses it

#include <algorithm>
#include <fstream>
#include <stdexcept>

namespace relokv_llama_cpp {

std::uint64_t file_id(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("llama.cpp engine: cannot read '" + path + "'");
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  std::vector<char> buf(std::size_t{8} << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    XXH3_64bits_update(h, buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  const std::uint64_t id = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return id;
}

std::optional<std::string> meta(const llama_model* m, const std::string& key) {
  char buf[256];
  const std::int32_t n = llama_model_meta_val_str(m, key.c_str(), buf, sizeof buf);
  if (n < 0) return std::nullopt;
  return std::string(buf, static_cast<std::size_t>(std::min<std::int32_t>(n, sizeof buf - 1)));
}

std::int32_t head_width(const llama_model* m) {
  const std::string arch = meta(m, "general.architecture").value_or("");
  if (const auto kl = meta(m, arch + ".attention.key_length")) return std::stoi(*kl);
  return llama_model_n_embd(m) / std::max(1, llama_model_n_head(m));
}

std::vector<std::vector<std::int32_t>> image_parts(const llama_model* m, std::int32_t layers) {
  if (llama_model_n_swa(m) <= 0) return {};
  const std::string arch = meta(m, "general.architecture").value_or("?");
  if (arch != "gemma3")
    throw std::runtime_error("llama.cpp engine: the sliding-window layers of architecture '" +
                             arch + "' are not known to the adapter (gemma3 is)");
  const auto p = meta(m, arch + ".attention.sliding_window_pattern");
  const std::int32_t pattern = p ? std::stoi(*p) : 6;
  if (pattern < 1)
    throw std::runtime_error("llama.cpp engine: sliding_window_pattern " + std::to_string(pattern));
  std::vector<std::vector<std::int32_t>> parts(2);
  for (std::int32_t l = 0; l < layers; ++l) parts[l % pattern < pattern - 1 ? 1 : 0].push_back(l);
  return parts;
}

}  // namespace relokv_llama_cpp
