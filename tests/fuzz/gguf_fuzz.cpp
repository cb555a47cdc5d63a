// libFuzzer target: the GGUF reader either rejects the bytes with gguf_error or yields tensors
// that dequantize without touching memory outside the file.
#include <cstdint>
#include <vector>

#include "gguf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto f =
        relokv_engine::gguf_file::from_memory(std::vector<std::uint8_t>(data, data + size));
    std::vector<float> row;
    for (const auto& t : f.tensors()) {
      if (t.dims[0] > (1u << 16)) continue;
      row.resize(t.dims[0]);
      f.dequantize_row(t, 0, row.data());
      if (t.rows() > 1) f.dequantize_row(t, t.rows() - 1, row.data());
    }
  } catch (const relokv_engine::gguf_error&) {
  }
  return 0;
}
