// libFuzzer target: one dataset line. parse_qa_line either returns a record or throws
// std::runtime_error that names the line; nothing else escapes and nothing crashes.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "dataset.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string line(reinterpret_cast<const char*>(data), size);
  try {
    const auto r = relokv_rag::parse_qa_line(line, "fuzz:1");
    for (const auto& p : r.passages) (void)p.second.size();
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).rfind("fuzz:1: ", 0) != 0) std::abort();
  }
  return 0;
}
