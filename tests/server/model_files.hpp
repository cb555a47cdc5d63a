#pragma once
// The models scripts/get-model fetched, for the server tests that need a real tokenizer.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "support/catch.hpp"
#include "support/skip.hpp"

namespace relokv_test {

/// The path of `name` in the model cache ($RELOKV_MODEL_DIR or ~/.cache/relokv), or empty
/// after a warning when it is not there (a failure under CI=true, where scripts/test fetches
/// every model).
inline std::string fetched_model(const char* name) {
  const char* home = std::getenv("HOME");
  const std::string dir = std::getenv("RELOKV_MODEL_DIR") != nullptr
                              ? std::getenv("RELOKV_MODEL_DIR")
                              : std::string(home ? home : "") + "/.cache/relokv";
  const std::string path = dir + "/" + name;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
    return path;
  }
  if (in_ci()) FAIL("CI=true: no " << path << " (scripts/get-model)");
  WARN("no " << path << ": its case is not run (scripts/get-model fetches it)");
  return {};
}

}  // namespace relokv_test
