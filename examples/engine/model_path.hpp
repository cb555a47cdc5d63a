#pragma once
// Where the reference engine looks for a model: $RELOKV_MODEL (for the default model), else the
// cache that scripts/get-model fills ($RELOKV_MODEL_DIR or ~/.cache/relokv). Empty when there
// is none.
#include <sys/stat.h>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace relokv_engine {

/// The models scripts/get-model knows, by the name it takes.
inline std::string model_file_name(const std::string& name) {
  if (name == "smollm2") return "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (name == "qwen2.5-0.5b") return "Qwen2.5-Coder-0.5B-Instruct.gguf";
  if (name == "qwen2.5-1.5b") return "Qwen2.5-Coder-1.5B-Instruct.gguf";
  if (name == "gemma3-270m") return "gemma-3-270m-q4_k_m.gguf";
  throw std::invalid_argument("unknown model '" + name +
                              "' (smollm2, qwen2.5-0.5b, qwen2.5-1.5b, gemma3-270m)");
}

inline std::string default_model_path(const std::string& name = "smollm2") {
  auto exists = [](const std::string& p) {
    struct stat st {};
    return !p.empty() && ::stat(p.c_str(), &st) == 0 && st.st_size > 0;
  };
  if (const char* m = std::getenv("RELOKV_MODEL"); m != nullptr && name == "smollm2")
    return exists(m) ? std::string(m) : "";
  std::string dir;
  if (const char* d = std::getenv("RELOKV_MODEL_DIR"))
    dir = d;
  else if (const char* h = std::getenv("HOME"))
    dir = std::string(h) + "/.cache/relokv";
  const std::string p = dir + "/" + model_file_name(name);
  return exists(p) ? p : "";
}

}  // namespace relokv_engine
