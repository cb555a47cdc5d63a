#pragma once
// Builds small GGUF files in memory for the reader's tests and the fuzz corpus.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace relokv_test {

class gguf_writer {
 public:
  explicit gguf_writer(std::uint32_t version = 3, std::uint64_t alignment = 32)
      : version_(version), alignment_(alignment) {}

  void kv_u32(const std::string& k, std::uint32_t v) { key(k, 4), pod(kv_, v); }
  void kv_f32(const std::string& k, float v) { key(k, 6), pod(kv_, v); }
  void kv_str(const std::string& k, const std::string& v) { key(k, 8), str(kv_, v); }
  void kv_strs(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9);
    pod(kv_, std::uint32_t{8});
    pod(kv_, std::uint64_t{v.size()});
    for (const auto& s : v) str(kv_, s);
  }
  void kv_i32s(const std::string& k, const std::vector<std::int32_t>& v) {
    key(k, 9);
    pod(kv_, std::uint32_t{5});
    pod(kv_, std::uint64_t{v.size()});
    for (auto x : v) pod(kv_, x);
  }
  void kv_f32s(const std::string& k, const std::vector<float>& v) {
    key(k, 9);
    pod(kv_, std::uint32_t{6});
    pod(kv_, std::uint64_t{v.size()});
    for (auto x : v) pod(kv_, x);
  }
  void kv_bool(const std::string& k, bool v) { key(k, 7), pod(kv_, std::uint8_t{v}); }
  /// A tensor with raw block bytes (already in the type's layout).
  void tensor(const std::string& name, std::vector<std::uint64_t> dims, std::uint32_t type,
              const std::vector<std::uint8_t>& bytes) {
    while (data_.size() % alignment_) data_.push_back(0);
    str(ti_, name);
    pod(ti_, static_cast<std::uint32_t>(dims.size()));
    for (auto d : dims) pod(ti_, d);
    pod(ti_, type);
    pod(ti_, std::uint64_t{data_.size()});
    append(data_, bytes.data(), bytes.size());
    ++n_tensors_;
  }
  void tensor_f32(const std::string& name, std::vector<std::uint64_t> dims,
                  const std::vector<float>& v) {
    std::vector<std::uint8_t> b(v.size() * 4);
    if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());  // an empty tensor: no copy
    tensor(name, std::move(dims), 0, b);
  }

  std::vector<std::uint8_t> bytes() const {
    std::vector<std::uint8_t> out;
    pod(out, std::uint32_t{0x46554747});
    pod(out, version_);
    pod(out, n_tensors_);
    pod(out, n_kv_);
    append(out, kv_.data(), kv_.size());
    append(out, ti_.data(), ti_.size());
    while (out.size() % alignment_) out.push_back(0);
    append(out, data_.data(), data_.size());
    return out;
  }

 private:
  // resize + memcpy rather than insert: GCC 12 reports a false -Wstringop-overflow on
  // vector<uint8_t>::insert of small ranges.
  static void append(std::vector<std::uint8_t>& o, const void* p, std::size_t n) {
    // (The bound also tells GCC that n is no wrapped-around size.)
    if (n == 0 || n > (std::size_t{1} << 40)) return;
    const std::size_t at = o.size();
    o.resize(at + n);
    std::memcpy(o.data() + at, p, n);
  }
  template <class T>
  static void pod(std::vector<std::uint8_t>& o, T v) {
    append(o, &v, sizeof v);
  }
  static void str(std::vector<std::uint8_t>& o, const std::string& s) {
    pod(o, std::uint64_t{s.size()});
    append(o, s.data(), s.size());
  }
  void key(const std::string& k, std::uint32_t type) {
    str(kv_, k);
    pod(kv_, type);
    ++n_kv_;
  }

  std::uint32_t version_;
  std::uint64_t alignment_;
  std::uint64_t n_tensors_ = 0, n_kv_ = 0;
  std::vector<std::uint8_t> kv_, ti_, data_;
};

}  // namespace relokv_test
