// GGUF parsing and dequantization (see gguf.hpp).
#include "gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <limits>

#include <relokv/dtype.hpp>

namespace relokv_engine {
namespace {

constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr std::uint64_t kMaxDims = 4;

enum vtype : std::uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32v = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

class cursor {
 public:
  cursor(const std::uint8_t* b, std::uint64_t n, const std::string& file)
      : b_(b), n_(n), file_(file) {}
  [[nodiscard]] std::uint64_t pos() const noexcept { return p_; }
  [[nodiscard]] std::uint64_t left() const noexcept { return n_ - p_; }
  void need(std::uint64_t k, const char* what) const {
    if (k > left())
      throw gguf_error(file_, p_,
                       std::string("truncated: ") + what + " needs " + std::to_string(k) +
                           " bytes, " + std::to_string(left()) + " left");
  }
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_ + p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string str(const char* what) {
    const std::uint64_t at = p_;
    const auto len = get<std::uint64_t>(what);
    if (len > left())
      throw gguf_error(
          file_, at,
          std::string(what) + ": string length " + std::to_string(len) + " exceeds the file");
    std::string s(reinterpret_cast<const char*>(b_ + p_), static_cast<std::size_t>(len));
    p_ += len;
    return s;
  }
  [[noreturn]] void fail(std::uint64_t at, const std::string& problem) const {
    throw gguf_error(file_, at, problem);
  }
  /// Metadata values (array elements) the reader still holds: each costs sizeof(gguf_value)
  /// in memory, far more than its bytes in the file, so a file cannot make the reader hold
  /// more than kMaxMetadataValues of them (a vocabulary of 150k tokens, its merges and types,
  /// is about half a million).
  static constexpr std::uint64_t kMaxMetadataValues = std::uint64_t{1} << 23;
  std::uint64_t values_left = kMaxMetadataValues;
  /// Bytes at the end of the file that what follows the metadata needs at least (the tensor
  /// infos): metadata cannot claim them.
  std::uint64_t tail = 0;
  [[nodiscard]] std::uint64_t meta_left() const noexcept {
    return left() > tail ? left() - tail : 0;
  }

 private:
  const std::uint8_t* b_;
  std::uint64_t n_;
  std::uint64_t p_ = 0;
  const std::string& file_;
};

std::uint64_t min_size(std::uint32_t t) {
  switch (t) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32v:
      return 4;
    case kU64:
    case kI64:
    case kF64:
    case kString:
      return 8;
    case kArray:
      return 12;
    default:
      return 0;
  }
}

gguf_value read_value(cursor& c, std::uint32_t t, int depth) {
  const std::uint64_t at = c.pos();
  switch (t) {
    case kU8:
      return {std::uint64_t{c.get<std::uint8_t>("u8")}};
    case kI8:
      return {std::int64_t{c.get<std::int8_t>("i8")}};
    case kU16:
      return {std::uint64_t{c.get<std::uint16_t>("u16")}};
    case kI16:
      return {std::int64_t{c.get<std::int16_t>("i16")}};
    case kU32:
      return {std::uint64_t{c.get<std::uint32_t>("u32")}};
    case kI32:
      return {std::int64_t{c.get<std::int32_t>("i32")}};
    case kU64:
      return {c.get<std::uint64_t>("u64")};
    case kI64:
      return {c.get<std::int64_t>("i64")};
    case kF32v:
      return {double{c.get<float>("f32")}};
    case kF64:
      return {c.get<double>("f64")};
    case kBool: {
      const auto b = c.get<std::uint8_t>("bool");
      if (b > 1) c.fail(at, "bool value " + std::to_string(b) + " is neither 0 nor 1");
      return {b == 1};
    }
    case kString:
      return {c.str("string value")};
    case kArray: {
      if (depth > 2) c.fail(at, "arrays nested too deeply");
      const auto et = c.get<std::uint32_t>("array type");
      const auto n = c.get<std::uint64_t>("array length");
      const std::uint64_t ms = min_size(et);
      if (ms == 0) c.fail(at, "unknown array element type " + std::to_string(et));
      if (n > c.meta_left() / ms)
        c.fail(at, "array of " + std::to_string(n) + " elements exceeds the file");
      if (n > c.values_left)
        c.fail(at, "array of " + std::to_string(n) + " elements exceeds the reader's limit of " +
                       std::to_string(cursor::kMaxMetadataValues) + " metadata values in all");
      c.values_left -= n;
      gguf_value::array a;
      a.reserve(static_cast<std::size_t>(n));
      for (std::uint64_t i = 0; i < n; ++i) a.push_back(read_value(c, et, depth + 1));
      return {std::move(a)};
    }
    default:
      c.fail(at, "unknown metadata value type " + std::to_string(t));
  }
}

}  // namespace

bool type_supported(std::uint32_t id) noexcept {
  switch (static_cast<ggml_type>(id)) {
    case ggml_type::kF32:
    case ggml_type::kF16:
    case ggml_type::kBF16:
    case ggml_type::kQ4_0:
    case ggml_type::kQ4_1:
    case ggml_type::kQ5_0:
    case ggml_type::kQ8_0:
    case ggml_type::kQ4_K:
    case ggml_type::kQ6_K:
      return true;
  }
  return false;
}

type_traits traits_of(ggml_type t) noexcept {
  switch (t) {
    case ggml_type::kF32:
      return {1, 4, "F32"};
    case ggml_type::kF16:
      return {1, 2, "F16"};
    case ggml_type::kBF16:
      return {1, 2, "BF16"};
    case ggml_type::kQ4_0:
      return {32, 18, "Q4_0"};
    case ggml_type::kQ4_1:
      return {32, 20, "Q4_1"};
    case ggml_type::kQ5_0:
      return {32, 22, "Q5_0"};
    case ggml_type::kQ8_0:
      return {32, 34, "Q8_0"};
    case ggml_type::kQ4_K:
      return {256, 144, "Q4_K"};
    case ggml_type::kQ6_K:
      return {256, 210, "Q6_K"};
  }
  return {1, 1, "?"};
}

gguf_file gguf_file::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw gguf_error(path, 0, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw gguf_error(path, 0, "cannot stat");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    throw gguf_error(path, 0, "empty file");
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw gguf_error(path, 0, "mmap failed");
  gguf_file f;
  f.name_ = path;
  f.hold_ = std::shared_ptr<const void>(
      m, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  f.base_ = static_cast<const std::uint8_t*>(m);
  f.size_ = size;
  f.parse();
  return f;
}

gguf_file gguf_file::from_memory(std::vector<std::uint8_t> bytes, std::string name) {
  gguf_file f;
  auto held = std::make_shared<std::vector<std::uint8_t>>(std::move(bytes));
  f.name_ = std::move(name);
  f.base_ = held->data();
  f.size_ = held->size();
  f.hold_ = held;
  f.parse();
  return f;
}

void gguf_file::parse() {
  cursor c(base_, size_, name_);
  const auto magic = c.get<std::uint32_t>("magic");
  if (magic != kMagic) c.fail(0, "not a GGUF file (bad magic)");
  version_ = c.get<std::uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    c.fail(4, "unsupported GGUF version " + std::to_string(version_) + " (2 and 3 are)");
  const auto n_tensors = c.get<std::uint64_t>("tensor count");
  const auto n_kv = c.get<std::uint64_t>("metadata count");
  // Every tensor info takes at least 24 bytes after the metadata.
  if (n_tensors > c.left() / 24)
    c.fail(8, "tensor count " + std::to_string(n_tensors) + " exceeds the file");
  c.tail = n_tensors * 24;
  if (n_kv > c.meta_left() / 12)
    c.fail(16, "metadata count " + std::to_string(n_kv) + " exceeds the file");
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::uint64_t at = c.pos();
    std::string key = c.str("metadata key");
    const auto t = c.get<std::uint32_t>("metadata type");
    gguf_value v = read_value(c, t, 0);
    if (!meta_.emplace(std::move(key), std::move(v)).second) c.fail(at, "duplicate metadata key");
  }
  if (has("general.alignment")) {
    const std::int64_t a = get_int("general.alignment");
    if (a <= 0 || (a & (a - 1)) != 0 || a > 1 << 20)
      c.fail(c.pos(), "general.alignment " + std::to_string(a) + " is not a power of two");
    alignment_ = static_cast<std::uint64_t>(a);
  }
  if (n_tensors > c.left() / 24)
    c.fail(8, "tensor count " + std::to_string(n_tensors) + " exceeds the file");
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    const std::uint64_t at = c.pos();
    gguf_tensor t;
    t.name = c.str("tensor name");
    const auto nd = c.get<std::uint32_t>("tensor dims");
    if (nd == 0 || nd > kMaxDims)
      c.fail(at, "tensor '" + t.name + "' has " + std::to_string(nd) + " dimensions (1 to 4)");
    t.elements = 1;
    for (std::uint32_t d = 0; d < nd; ++d) {
      const auto n = c.get<std::uint64_t>("tensor dim");
      if (n == 0 || t.elements > std::numeric_limits<std::uint64_t>::max() / n / 8)
        c.fail(at, "tensor '" + t.name + "' has a bad dimension " + std::to_string(n));
      t.dims.push_back(n);
      t.elements *= n;
    }
    const auto type = c.get<std::uint32_t>("tensor type");
    if (!type_supported(type))
      c.fail(at, "tensor '" + t.name + "' has unsupported type " + std::to_string(type) +
                     " (supported: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q8_0 Q4_K Q6_K)");
    t.type = static_cast<ggml_type>(type);
    t.offset = c.get<std::uint64_t>("tensor offset");
    const type_traits tr = traits_of(t.type);
    if (t.dims[0] % tr.block_elems != 0)
      c.fail(at, "tensor '" + t.name + "': row length " + std::to_string(t.dims[0]) +
                     " is not a multiple of the " + tr.name + " block");
    t.bytes = t.elements / tr.block_elems * tr.block_bytes;
    if (by_name_.count(t.name)) c.fail(at, "duplicate tensor '" + t.name + "'");
    by_name_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  const std::uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (gguf_tensor& t : tensors_) {
    if (t.offset % alignment_ != 0)
      c.fail(c.pos(), "tensor '" + t.name + "' offset " + std::to_string(t.offset) +
                          " is not aligned to " + std::to_string(alignment_));
    if (data_start > size_ || t.offset > size_ - data_start ||
        t.bytes > size_ - data_start - t.offset)
      c.fail(data_start + t.offset, "tensor '" + t.name + "' (" + std::to_string(t.bytes) +
                                        " bytes) extends past the end of the file");
    t.data = base_ + data_start + t.offset;
  }
}

const gguf_value& gguf_file::value(const std::string& key) const {
  const auto it = meta_.find(key);
  if (it == meta_.end()) throw gguf_error(name_, 0, "missing metadata key '" + key + "'");
  return it->second;
}
std::int64_t gguf_file::get_int(const std::string& key) const {
  const gguf_value& v = value(key);
  if (const auto* i = std::get_if<std::int64_t>(&v.v)) return *i;
  if (const auto* u = std::get_if<std::uint64_t>(&v.v)) return static_cast<std::int64_t>(*u);
  if (const auto* b = std::get_if<bool>(&v.v)) return *b ? 1 : 0;
  throw gguf_error(name_, 0, "metadata '" + key + "' is not an integer");
}
std::int64_t gguf_file::get_int(const std::string& key, std::int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double gguf_file::get_float(const std::string& key) const {
  const gguf_value& v = value(key);
  if (const auto* d = std::get_if<double>(&v.v)) return *d;
  return static_cast<double>(get_int(key));
}
double gguf_file::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}
std::string gguf_file::get_string(const std::string& key) const {
  const gguf_value& v = value(key);
  if (const auto* s = std::get_if<std::string>(&v.v)) return *s;
  throw gguf_error(name_, 0, "metadata '" + key + "' is not a string");
}
std::vector<std::string> gguf_file::get_strings(const std::string& key) const {
  const auto* a = std::get_if<gguf_value::array>(&value(key).v);
  if (!a) throw gguf_error(name_, 0, "metadata '" + key + "' is not an array");
  std::vector<std::string> out;
  out.reserve(a->size());
  for (const gguf_value& e : *a) {
    const auto* s = std::get_if<std::string>(&e.v);
    if (!s) throw gguf_error(name_, 0, "metadata '" + key + "' is not an array of strings");
    out.push_back(*s);
  }
  return out;
}
std::vector<std::int64_t> gguf_file::get_ints(const std::string& key) const {
  const auto* a = std::get_if<gguf_value::array>(&value(key).v);
  if (!a) throw gguf_error(name_, 0, "metadata '" + key + "' is not an array");
  std::vector<std::int64_t> out;
  for (const gguf_value& e : *a) {
    if (const auto* i = std::get_if<std::int64_t>(&e.v))
      out.push_back(*i);
    else if (const auto* u = std::get_if<std::uint64_t>(&e.v))
      out.push_back(static_cast<std::int64_t>(*u));
    else
      throw gguf_error(name_, 0, "metadata '" + key + "' is not an array of integers");
  }
  return out;
}
std::vector<double> gguf_file::get_floats(const std::string& key) const {
  const auto* a = std::get_if<gguf_value::array>(&value(key).v);
  if (!a) throw gguf_error(name_, 0, "metadata '" + key + "' is not an array");
  std::vector<double> out;
  for (const gguf_value& e : *a) {
    if (const auto* d = std::get_if<double>(&e.v))
      out.push_back(*d);
    else
      throw gguf_error(name_, 0, "metadata '" + key + "' is not an array of floats");
  }
  return out;
}
bool gguf_file::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& v = value(key).v;
  if (const auto* b = std::get_if<bool>(&v)) return *b;
  if (const auto* i = std::get_if<std::int64_t>(&v)) return *i != 0;
  if (const auto* u = std::get_if<std::uint64_t>(&v)) return *u != 0;
  throw gguf_error(name_, 0, "metadata '" + key + "' is not a boolean");
}
bool gguf_file::has_tensor(const std::string& n) const { return by_name_.count(n) != 0; }
const gguf_tensor& gguf_file::tensor(const std::string& n) const {
  const auto it = by_name_.find(n);
  if (it == by_name_.end()) throw gguf_error(name_, 0, "missing tensor '" + n + "'");
  return tensors_[it->second];
}

void gguf_file::dequantize_row(const gguf_tensor& t, std::uint64_t row, float* out) const {
  const std::uint64_t n = t.dims[0];
  const type_traits tr = traits_of(t.type);
  dequantize_blocks(t.type, t.data + row * (n / tr.block_elems) * tr.block_bytes, n, out);
}

void dequantize_blocks(ggml_type type, const std::uint8_t* p, std::uint64_t n, float* out) {
  const type_traits tr = traits_of(type);
  switch (type) {
    case ggml_type::kF32:
      std::memcpy(out, p, n * 4);
      return;
    case ggml_type::kF16:
      for (std::uint64_t i = 0; i < n; ++i) out[i] = fp16_at(p + 2 * i);
      return;
    case ggml_type::kBF16:
      for (std::uint64_t i = 0; i < n; ++i) {
        relokv::bf16 b;
        std::memcpy(&b.bits, p + 2 * i, 2);
        out[i] = b.to_float();
      }
      return;
    case ggml_type::kQ4_0:
    case ggml_type::kQ4_1:
      // Block: fp16 scale d (and fp16 minimum m for Q4_1), then 16 bytes: element j in the low
      // nibble of byte j, element j + 16 in its high nibble.
      for (std::uint64_t b = 0; b < n / 32; ++b, p += tr.block_bytes, out += 32) {
        const float d = fp16_at(p);
        const bool q41 = type == ggml_type::kQ4_1;
        const float m = q41 ? fp16_at(p + 2) : -8.0f * d;
        const std::uint8_t* q = p + (q41 ? 4 : 2);
        for (int j = 0; j < 16; ++j) {
          out[j] = d * static_cast<float>(q[j] & 0xF) + m;
          out[j + 16] = d * static_cast<float>(q[j] >> 4) + m;
        }
      }
      return;
    case ggml_type::kQ5_0:
      // Block: fp16 scale d, 32 high bits (bit j for element j), then 16 bytes of low nibbles
      // laid out as in Q4_0; element value (5-bit unsigned - 16) * d.
      for (std::uint64_t b = 0; b < n / 32; ++b, p += 22, out += 32) {
        const float d = fp16_at(p);
        std::uint32_t qh = 0;
        std::memcpy(&qh, p + 2, 4);
        const std::uint8_t* q = p + 6;
        for (int j = 0; j < 16; ++j) {
          const int lo = static_cast<int>((q[j] & 0xF) | (((qh >> j) & 1u) << 4)) - 16;
          const int hi = static_cast<int>((q[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
          out[j] = d * static_cast<float>(lo);
          out[j + 16] = d * static_cast<float>(hi);
        }
      }
      return;
    case ggml_type::kQ4_K:
      // Super-block of 256: fp16 d and dmin, 12 bytes packing eight 6-bit (scale, min) pairs,
      // then 128 bytes of nibbles. Each 64 elements use 32 bytes: low nibbles for the first
      // 32 (pair 2i), high nibbles for the next 32 (pair 2i + 1); value d*sc*q - dmin*m.
      for (std::uint64_t b = 0; b < n / 256; ++b, p += 144, out += 256) {
        const float d = fp16_at(p), dmin = fp16_at(p + 2);
        const std::uint8_t* s = p + 4;
        const std::uint8_t* q = p + 16;
        const auto pair = [s](int j, int& sc, int& mn) { q4_k_scale_min(s, j, sc, mn); };
        for (int c = 0; c < 4; ++c) {
          int sc0 = 0, m0 = 0, sc1 = 0, m1 = 0;
          pair(2 * c, sc0, m0);
          pair(2 * c + 1, sc1, m1);
          const float d0 = d * static_cast<float>(sc0), o0 = dmin * static_cast<float>(m0);
          const float d1 = d * static_cast<float>(sc1), o1 = dmin * static_cast<float>(m1);
          const std::uint8_t* qc = q + 32 * c;
          float* y = out + 64 * c;
          for (int i = 0; i < 32; ++i) {
            y[i] = d0 * static_cast<float>(qc[i] & 0xF) - o0;
            y[i + 32] = d1 * static_cast<float>(qc[i] >> 4) - o1;
          }
        }
      }
      return;
    case ggml_type::kQ8_0:
      for (std::uint64_t b = 0; b < n / 32; ++b, p += 34, out += 32) {
        const float d = fp16_at(p);
        for (int j = 0; j < 32; ++j)
          out[j] = d * static_cast<float>(static_cast<std::int8_t>(p[2 + j]));
      }
      return;
    case ggml_type::kQ6_K:
      // Super-block of 256: 128 bytes of low 4 bits, 64 bytes of high 2 bits, 16 int8 scales,
      // fp16 d. Each half of 128 elements uses 64 low bytes, 32 high bytes and 8 scales.
      for (std::uint64_t b = 0; b < n / 256; ++b, p += 210, out += 256) {
        const std::uint8_t* ql = p;
        const std::uint8_t* qh = p + 128;
        const auto* sc = reinterpret_cast<const std::int8_t*>(p + 192);
        const float d = fp16_at(p + 208);
        for (int h = 0; h < 2; ++h) {
          float* y = out + 128 * h;
          const std::uint8_t* l = ql + 64 * h;
          const std::uint8_t* hi = qh + 32 * h;
          const std::int8_t* s = sc + 8 * h;
          for (int i = 0; i < 32; ++i) {
            const int is = i / 16;
            const int q1 = ((l[i] & 0xF) | (((hi[i] >> 0) & 3) << 4)) - 32;
            const int q2 = ((l[i + 32] & 0xF) | (((hi[i] >> 2) & 3) << 4)) - 32;
            const int q3 = ((l[i] >> 4) | (((hi[i] >> 4) & 3) << 4)) - 32;
            const int q4 = ((l[i + 32] >> 4) | (((hi[i] >> 6) & 3) << 4)) - 32;
            y[i] = d * static_cast<float>(s[is] * q1);
            y[i + 32] = d * static_cast<float>(s[is + 2] * q2);
            y[i + 64] = d * static_cast<float>(s[is + 4] * q3);
            y[i + 96] = d * static_cast<float>(s[is + 6] * q4);
          }
        }
      }
      return;
  }
}

std::vector<float> gguf_file::dequantize(const gguf_tensor& t) const {
  std::vector<float> out(static_cast<std::size_t>(t.elements));
  for (std::uint64_t r = 0; r < t.rows(); ++r) dequantize_row(t, r, out.data() + r * t.dims[0]);
  return out;
}

}  // namespace relokv_engine
