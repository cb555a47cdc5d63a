#include "seq_image.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace relokv_llama_cpp {
namespace {

/// llama_context's sequence-state magic (llama-context.cpp: io_magic).
constexpr std::uint32_t kMagic = 0xaf143cd8u;

/// Reads fields from an image, failing with the field's name when the bytes run out.
class reader {
 public:
  explicit reader(const std::vector<std::uint8_t>& b) : b_(b) {}
  template <class T>
  T get(const char* what) {
    T v{};
    need(sizeof v, what);
    std::memcpy(&v, b_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::size_t skip(std::size_t n, const char* what) {
    need(n, what);
    const std::size_t start = at_;
    at_ += n;
    return start;
  }
  [[nodiscard]] std::size_t left() const noexcept { return b_.size() - at_; }

 private:
  void need(std::size_t n, const char* what) const {
    if (n > b_.size() - at_)
      throw std::runtime_error(std::string("llama.cpp sequence image: truncated at ") + what +
                               " (offset " + std::to_string(at_) + ", " +
                               std::to_string(b_.size()) + " bytes)");
  }
  const std::vector<std::uint8_t>& b_;
  std::size_t at_ = 0;
};

template <class T>
void expect(T got, T want, const char* what) {
  if (got != want)
    throw std::runtime_error(std::string("llama.cpp sequence image: ") + what + " is " +
                             std::to_string(got) + ", the adapter expects " + std::to_string(want));
}

/// Appends bytes (resize and copy: GCC 12 misreads vector::insert of a few bytes as an overflow).
void append(std::vector<std::uint8_t>& out, const void* p, std::size_t n) {
  const std::size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, p, n);
}
template <class T>
void put(std::vector<std::uint8_t>& out, T v) {
  append(out, &v, sizeof v);
}

}  // namespace

std::vector<std::vector<std::int32_t>> image_geometry::layer_parts() const {
  if (!parts.empty()) return parts;
  std::vector<std::int32_t> all;
  for (std::int32_t l = 0; l < n_layers; ++l) all.push_back(l);
  return {all};
}

seq_image seq_image::parse(std::vector<std::uint8_t> bytes, const image_geometry& g) {
  seq_image im;
  im.bytes_ = std::move(bytes);
  im.g_ = g;
  const auto parts = g.layer_parts();
  std::size_t covered = 0;
  for (const auto& part : parts) covered += part.size();
  if (covered != static_cast<std::size_t>(g.n_layers))
    throw std::runtime_error("llama.cpp sequence image: the parts hold " + std::to_string(covered) +
                             " layers of " + std::to_string(g.n_layers));
  im.k_at_.assign(static_cast<std::size_t>(g.n_layers), 0);
  im.v_at_.assign(static_cast<std::size_t>(g.n_layers), 0);
  reader r(im.bytes_);
  expect<std::uint32_t>(r.get<std::uint32_t>("magic"), kMagic, "magic");
  (void)r.get<std::int32_t>("the sequence");
  for (std::size_t pi = 0; pi < parts.size(); ++pi) {
    const auto& part = parts[pi];
    expect<std::uint32_t>(r.get<std::uint32_t>("n_stream"), 1, "n_stream");
    const auto n = r.get<std::uint32_t>("cell_count");
    if (n > (1u << 24))
      throw std::runtime_error("llama.cpp sequence image: implausible cell count");
    if (pi > 0 && n != im.pos_.size())
      throw std::runtime_error("llama.cpp sequence image: part " + std::to_string(pi) + " holds " +
                               std::to_string(n) + " cells, part 0 " +
                               std::to_string(im.pos_.size()));
    for (std::uint32_t i = 0; i < n; ++i) {
      const auto p = r.get<std::int32_t>("a cell's position");
      if (pi == 0)
        im.pos_.push_back(p);
      else if (p != im.pos_[i])
        throw std::runtime_error("llama.cpp sequence image: part " + std::to_string(pi) +
                                 "'s cell " + std::to_string(i) + " is at position " +
                                 std::to_string(p) + ", part 0's at " + std::to_string(im.pos_[i]));
      const auto n_seq = r.get<std::uint32_t>("a cell's sequence count");
      expect<std::uint32_t>(n_seq, 1, "a cell's sequence count");
      (void)r.get<std::int32_t>("a cell's sequence");
    }
    if (n == 0) continue;
    const auto v_trans = r.get<std::uint32_t>("v_trans");
    if (v_trans > 1) throw std::runtime_error("llama.cpp sequence image: v_trans is not 0 or 1");
    if (pi > 0 && (v_trans == 1) != im.v_trans_)
      throw std::runtime_error("llama.cpp sequence image: the parts differ in v_trans");
    im.v_trans_ = v_trans == 1;
    expect<std::uint32_t>(r.get<std::uint32_t>("n_layer"), static_cast<std::uint32_t>(part.size()),
                          "n_layer");
    const std::size_t rows = g.row_bytes() * n;
    for (const std::int32_t l : part) {
      expect<std::int32_t>(r.get<std::int32_t>("k_type"), g.ggml_type, "k_type");
      expect<std::uint64_t>(r.get<std::uint64_t>("k_row_bytes"), g.row_bytes(), "k_row_bytes");
      im.k_at_[static_cast<std::size_t>(l)] = r.skip(rows, "K rows");
    }
    for (const std::int32_t l : part) {
      expect<std::int32_t>(r.get<std::int32_t>("v_type"), g.ggml_type, "v_type");
      if (!im.v_trans_) {
        expect<std::uint64_t>(r.get<std::uint64_t>("v_row_bytes"), g.row_bytes(), "v_row_bytes");
      } else {
        expect<std::uint32_t>(r.get<std::uint32_t>("v_elem_bytes"),
                              static_cast<std::uint32_t>(g.elem_bytes), "v_elem_bytes");
        expect<std::uint32_t>(r.get<std::uint32_t>("n_embd_v"),
                              static_cast<std::uint32_t>(g.row_elems), "n_embd_v");
      }
      im.v_at_[static_cast<std::size_t>(l)] = r.skip(rows, "V rows");
    }
  }
  if (r.left() != 0)
    throw std::runtime_error("llama.cpp sequence image: " + std::to_string(r.left()) +
                             " bytes after the last layer");
  return im;
}

void seq_image::row(std::int32_t layer, std::int32_t cell, bool v, std::byte* out) const {
  const auto l = static_cast<std::size_t>(layer);
  const auto c = static_cast<std::size_t>(cell);
  const std::size_t rb = g_.row_bytes();
  if (!v) {
    std::memcpy(out, bytes_.data() + k_at_[l] + c * rb, rb);
    return;
  }
  if (!v_trans_) {
    std::memcpy(out, bytes_.data() + v_at_[l] + c * rb, rb);
    return;
  }
  // Transposed: element j of every cell, then element j + 1.
  const auto eb = static_cast<std::size_t>(g_.elem_bytes);
  const std::size_t n = pos_.size();
  for (std::size_t j = 0; j < static_cast<std::size_t>(g_.row_elems); ++j)
    std::memcpy(out + j * eb, bytes_.data() + v_at_[l] + (j * n + c) * eb, eb);
}

std::vector<std::uint8_t> write_image(std::span<const std::int32_t> pos, std::int32_t seq,
                                      bool v_trans, const image_geometry& g,
                                      const row_source& rows) {
  const std::size_t n = pos.size();
  const std::size_t rb = g.row_bytes();
  std::vector<std::uint8_t> out;
  out.reserve(32 + n * 24 + 2 * static_cast<std::size_t>(g.n_layers) * (16 + n * rb));
  const auto eb = static_cast<std::size_t>(g.elem_bytes);
  std::vector<std::byte> row(rb);
  put<std::uint32_t>(out, kMagic);
  put<std::int32_t>(out, seq);
  for (const auto& part : g.layer_parts()) {
    put<std::uint32_t>(out, 1);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(n));
    for (std::int32_t p : pos) {
      put<std::int32_t>(out, p);
      put<std::uint32_t>(out, 1);
      put<std::int32_t>(out, seq);
    }
    if (n == 0) continue;
    put<std::uint32_t>(out, v_trans ? 1u : 0u);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(part.size()));
    for (const std::int32_t l : part) {
      put<std::int32_t>(out, g.ggml_type);
      put<std::uint64_t>(out, rb);
      for (std::size_t c = 0; c < n; ++c) {
        rows(l, static_cast<std::int32_t>(c), false, row.data());
        append(out, row.data(), rb);
      }
    }
    for (const std::int32_t l : part) {
      put<std::int32_t>(out, g.ggml_type);
      if (!v_trans) {
        put<std::uint64_t>(out, rb);
        for (std::size_t c = 0; c < n; ++c) {
          rows(l, static_cast<std::int32_t>(c), true, row.data());
          append(out, row.data(), rb);
        }
      } else {
        put<std::uint32_t>(out, static_cast<std::uint32_t>(g.elem_bytes));
        put<std::uint32_t>(out, static_cast<std::uint32_t>(g.row_elems));
        const std::size_t base = out.size();
        out.resize(base + n * rb);
        for (std::size_t c = 0; c < n; ++c) {
          rows(l, static_cast<std::int32_t>(c), true, row.data());
          for (std::size_t j = 0; j < static_cast<std::size_t>(g.row_elems); ++j)
            std::memcpy(out.data() + base + (j * n + c) * eb, row.data() + j * eb, eb);
        }
      }
    }
  }
  return out;
}

}  // namespace relokv_llama_cpp
