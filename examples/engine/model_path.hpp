#pragma once
// Where the reference engine looks for a model: $RELOKV_MODEL, else the cache that
// scripts/get-model fills ($RELOKV_MODEL_DIR or ~/.cache/relokv). Empty when there is none.
#include <sys/stat.h>
#include <cstdlib>
#include <string>

namespace relokv_engine {

inline std::string default_model_path() {
  auto exists = [](const std::string& p) {
    struct stat st {};
    return !p.empty() && ::stat(p.c_str(), &st) == 0 && st.st_size > 0;
  };
  if (const char* m = std::getenv("RELOKV_MODEL")) return exists(m) ? std::string(m) : "";
  std::string dir;
  if (const char* d = std::getenv("RELOKV_MODEL_DIR"))
    dir = d;
  else if (const char* h = std::getenv("HOME"))
    dir = std::string(h) + "/.cache/relokv";
  const std::string p = dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  return exists(p) ? p : "";
}

}  // namespace relokv_engine
