#pragma once
// GGUF (versions 2 and 3) reader for the reference engine: metadata, tensor infos, alignment,
// memory-mapped tensor data and dequantization to fp32. Every malformed input is an error that
// names the file, the byte offset and the problem.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <relokv/dtype.hpp>

namespace relokv_engine {

/// The IEEE fp16 stored (unaligned, little-endian) at p, as fp32: the blocks' scales. F16C's
/// conversion where the build has it (the kernels call it per block).
[[nodiscard]] inline float fp16_at(const std::uint8_t* p) noexcept {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  relokv::fp16 x;
  x.bits = h;
  return x.to_float();
#endif
}

/// Q4_K's 6-bit scale and minimum of sub-block s (0-7) from a super-block's 12 packed bytes.
inline void q4_k_scale_min(const std::uint8_t* packed, int s, int& scale, int& min) noexcept {
  if (s < 4) {
    scale = packed[s] & 63;
    min = packed[s + 4] & 63;
  } else {
    scale = (packed[s + 4] & 0xF) | ((packed[s - 4] >> 6) << 4);
    min = (packed[s + 4] >> 4) | ((packed[s] >> 6) << 4);
  }
}

/// Tensor element types the reader can dequantize (ggml's numbering).
enum class ggml_type : std::uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ6_K = 14,
  kBF16 = 30,
};

/// A malformed, truncated or unsupported file.
class gguf_error : public std::runtime_error {
 public:
  gguf_error(const std::string& file, std::uint64_t offset, const std::string& problem)
      : std::runtime_error(file + ": offset " + std::to_string(offset) + ": " + problem),
        offset_(offset) {}
  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }

 private:
  std::uint64_t offset_;
};

/// A metadata value: integers (signed or not), floats, bools, strings, or arrays of them.
struct gguf_value {
  using array = std::vector<gguf_value>;
  std::variant<std::int64_t, std::uint64_t, double, bool, std::string, array> v;
};

struct gguf_tensor {
  std::string name;
  std::vector<std::uint64_t> dims;  ///< ggml order: dims[0] is the row length
  ggml_type type = ggml_type::kF32;
  std::uint64_t offset = 0;  ///< from the start of the data section
  const std::uint8_t* data = nullptr;
  std::uint64_t bytes = 0;
  std::uint64_t elements = 0;
  [[nodiscard]] std::uint64_t rows() const { return dims.empty() ? 0 : elements / dims[0]; }
};

class gguf_file {
 public:
  /// Memory-maps and parses a file.
  static gguf_file open(const std::string& path);
  /// Parses bytes held in memory (tests, fuzzing); `name` stands for the file in errors.
  static gguf_file from_memory(std::vector<std::uint8_t> bytes, std::string name = "<memory>");

  [[nodiscard]] std::uint32_t version() const noexcept { return version_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] std::uint64_t alignment() const noexcept { return alignment_; }

  [[nodiscard]] bool has(const std::string& key) const { return meta_.count(key) != 0; }
  [[nodiscard]] const gguf_value& value(const std::string& key) const;
  [[nodiscard]] std::int64_t get_int(const std::string& key) const;
  [[nodiscard]] std::int64_t get_int(const std::string& key, std::int64_t fallback) const;
  [[nodiscard]] double get_float(const std::string& key) const;
  [[nodiscard]] double get_float(const std::string& key, double fallback) const;
  [[nodiscard]] std::string get_string(const std::string& key) const;
  [[nodiscard]] std::vector<std::string> get_strings(const std::string& key) const;
  [[nodiscard]] std::vector<std::int64_t> get_ints(const std::string& key) const;
  [[nodiscard]] std::vector<double> get_floats(const std::string& key) const;
  /// A boolean (or integer, as some writers store them) value, or `fallback` when absent.
  [[nodiscard]] bool get_bool(const std::string& key, bool fallback) const;

  [[nodiscard]] const std::vector<gguf_tensor>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const gguf_tensor& tensor(const std::string& name) const;
  [[nodiscard]] bool has_tensor(const std::string& name) const;

  /// Dequantizes row `row` (dims[0] elements) of a tensor into out.
  void dequantize_row(const gguf_tensor& t, std::uint64_t row, float* out) const;
  /// What keeps the file's bytes alive (the mapping, or the vector of from_memory): views
  /// into tensor data that outlive this object hold it.
  [[nodiscard]] std::shared_ptr<const void> keep_alive() const noexcept { return hold_; }
  /// Dequantizes a whole tensor (elements floats).
  [[nodiscard]] std::vector<float> dequantize(const gguf_tensor& t) const;

 private:
  gguf_file() = default;
  void parse();

  std::string name_;
  std::shared_ptr<const void> hold_;  // the mapping or the vector
  const std::uint8_t* base_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::map<std::string, gguf_value> meta_;
  std::vector<gguf_tensor> tensors_;
  std::map<std::string, std::size_t> by_name_;
};

/// Elements per block and bytes per block of a type; throws for an unsupported id.
struct type_traits {
  std::uint64_t block_elems;
  std::uint64_t block_bytes;
  const char* name;
};
[[nodiscard]] bool type_supported(std::uint32_t id) noexcept;
/// Dequantizes n elements (whole blocks) of type `type` starting at p.
void dequantize_blocks(ggml_type type, const std::uint8_t* p, std::uint64_t n, float* out);
[[nodiscard]] type_traits traits_of(ggml_type t) noexcept;

}  // namespace relokv_engine
