#pragma once
// relokv inside llama.cpp, its machinery (llama_cpp_engine.cpp's alone): the llama.cpp context
// the engine drives (loading the model, its KV images, the probe of their layout), a planned
// prompt walked in position order (cached runs loaded as sequences of their own and moved by
// llama.cpp's K-shift, computed runs decoded), and the request's new blocks read back into
// relokv's pool. llama_cpp_engine.cpp holds the engine's calls over it.
#include "llama_cpp_engine.hpp"

#include <llama.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/store/block_format.hpp>

#include "model_info.hpp"
#include "seq_image.hpp"

namespace relokv_llama_cpp {
namespace context {

inline constexpr llama_seq_id kRequestSeq = 0;
/// The request's sequence, and one for each run of cached blocks loaded at once (a wave).
inline constexpr std::int32_t kSeqs = 64;
/// Sliding-window models: every cell the request fills is also in this sequence, so that
/// llama.cpp never hands a cell behind the window to another token (it reuses a cell held by
/// one sequence only) before the adapter has read it back.
inline constexpr llama_seq_id kPinSeq = kSeqs - 1;

template <class T>
inline constexpr ggml_type kv_type_of = std::is_same_v<T, float> ? GGML_TYPE_F32 : GGML_TYPE_F16;

inline void log_errors_only(ggml_log_level level, const char* text, void* /*user*/) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

inline void init_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    llama_log_set(log_errors_only, nullptr);
    llama_backend_init();
  });
}

inline std::string decode_error(std::int32_t rc) {
  switch (rc) {
    case 1:
      return "no KV slot for the batch (the context is full)";
    case 2:
      return "aborted";
    case -1:
      return "invalid input batch";
    default:
      return "error " + std::to_string(rc);
  }
}

}  // namespace context

template <class T>
struct engine<T>::impl {
  static constexpr llama_seq_id kRequestSeq = context::kRequestSeq;
  static constexpr std::int32_t kSeqs = context::kSeqs;
  static constexpr llama_seq_id kPinSeq = context::kPinSeq;
  engine_options opt;
  llama_model* model = nullptr;
  llama_context* ctx = nullptr;
  llama_memory_t mem = nullptr;
  llama_batch batch{};
  llama_batch rows_batch{};  ///< the adapter's rows (llama_batch.embd), when there is one
  std::int32_t vocab = 0, layers = 0, kv_heads = 0, head_dim = 0;
  image_geometry geo;
  bool v_trans = false;
  std::int32_t window = 0;  ///< llama.cpp's sliding window (0: none; then no pinning)
  std::uint64_t fingerprint = 0;
  std::optional<relokv::host_kv_storage<T>> pool;
  std::optional<cache_type> cache;

  // One run of cached blocks, loaded as a sequence of its own: consecutive blocks whose keys
  // were computed at consecutive positions and move by the same delta.
  struct load_group {
    std::int32_t first_block = 0, last_block = 0;  // in the plan, inclusive
    std::int32_t delta = 0;                        // new position - stored position
    llama_seq_id seq = -1;                         // while loaded
    std::int32_t last_pos = 0;                     // its last cached position (new)
  };
  /// A prompt being prefilled, walked in position order a step at a time: cached runs are
  /// shared into the request's sequence, computed runs decoded at their positions.
  struct prompt_walk {
    std::vector<relokv::token_t> tokens;
    std::vector<std::int32_t> stored;    // per block: where its keys were computed
    std::vector<std::uint8_t> comp;      // per position: computed (else loaded)
    std::vector<load_group> groups;      // the runs of cached blocks to load
    std::vector<std::int32_t> group_of;  // per loaded position: its group
    std::int32_t p = 0;                  // the next position
  };
  struct live_request {
    relokv::reuse_plan plan;
    std::int32_t n_tokens = 0;        // positions filled: the prompt, then decoded tokens
    std::optional<prompt_walk> walk;  // while the prompt is being prefilled
  };
  std::optional<live_request> live;
  seq_id live_id = -1;  // the live request's id (sequence_engine)
  seq_id next_seq = 0;
  relokv::token_t pending = -1;  // appended, not yet decoded

  void start(const relokv::request_layout& layout, const relokv::recompute::any_strategy& strategy,
             relokv_engine::prefill_stats* stats, const relokv::extra_keys& extras,
             std::uint64_t principal);
  void abandon() noexcept;
  live_request& sequence(seq_id s, const char* what);

  impl(const std::string& path, engine_options o) : opt(std::move(o)) {
    context::init_backend();
    if (opt.n_ctx < 16 || opt.n_batch < 1 || opt.num_blocks < 1 || opt.block_size < 1)
      throw std::invalid_argument(
          "llama.cpp engine: n_ctx >= 16, n_batch, num_blocks and "
          "block_size >= 1 are needed");
    // llama.cpp reserves an output row per sequence (kSeqs of them: the request's and one per
    // loaded run) and aborts when a batch holds fewer rows than that.
    if (opt.n_batch < kSeqs)
      throw std::invalid_argument("llama.cpp engine: n_batch must be at least " +
                                  std::to_string(kSeqs) + " (one output row per sequence), got " +
                                  std::to_string(opt.n_batch));
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    model = llama_model_load_from_file(path.c_str(), mp);
    if (model == nullptr)
      throw std::runtime_error("llama.cpp engine: llama.cpp could not load '" + path + "'");
    try {
      setup(path);
    } catch (...) {
      release_llama();
      throw;
    }
  }
  ~impl() { release_llama(); }

  void release_llama() noexcept {
    if (batch.token != nullptr) llama_batch_free(batch);
    batch = llama_batch{};
    if (rows_batch.embd != nullptr) llama_batch_free(rows_batch);
    rows_batch = llama_batch{};
    if (ctx != nullptr) llama_free(ctx);
    ctx = nullptr;
    if (model != nullptr) llama_model_free(model);
    model = nullptr;
  }

  void setup(const std::string& path) {
    const llama_rope_type rt = llama_model_rope_type(model);
    if (rt == LLAMA_ROPE_TYPE_MROPE || rt == LLAMA_ROPE_TYPE_IMROPE || rt == LLAMA_ROPE_TYPE_VISION)
      throw std::runtime_error(
          "llama.cpp engine: M-RoPE models keep per-cell 2D positions the "
          "adapter does not move");
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<std::uint32_t>(opt.n_ctx);
    cp.n_batch = static_cast<std::uint32_t>(opt.n_batch);
    cp.n_ubatch = static_cast<std::uint32_t>(opt.n_batch);
    cp.n_seq_max = kSeqs;
    cp.kv_unified = true;  // one pool of cells: a loaded run is shared into the request
    // A sliding-window model keeps its whole window (llama-server's --swa-full): a windowed
    // layer's cache must hold every cell for a span to be loaded, shifted and shared into a
    // request like the global layers' (the default SWA cache holds the last window and reuses
    // its cells, so positions a later request reads are gone).
    cp.swa_full = true;
    const auto threads = static_cast<std::int32_t>(
        opt.n_threads > 0 ? opt.n_threads : std::max(1u, std::thread::hardware_concurrency()));
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.type_k = context::kv_type_of<T>;
    cp.type_v = context::kv_type_of<T>;
    cp.no_perf = true;
    ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr)
      throw std::runtime_error("llama.cpp engine: llama.cpp could not make a context of " +
                               std::to_string(opt.n_ctx) + " cells");
    mem = llama_get_memory(ctx);
    if (!llama_memory_can_shift(mem))
      throw std::runtime_error(
          "llama.cpp engine: this context cannot shift its keys (K-shift), "
          "which is how a span moves to a new position");
    vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    layers = llama_model_n_layer(model);
    kv_heads = llama_model_n_head_kv(model);
    head_dim = head_width(model);
    geo.parts = image_parts(model, layers);
    window = geo.parts.empty() ? 0 : llama_model_n_swa(model);
    geo.n_layers = layers;
    geo.ggml_type = context::kv_type_of<T>;
    geo.elem_bytes = static_cast<std::int32_t>(sizeof(T));
    geo.row_elems = kv_heads * head_dim;
    batch = llama_batch_init(opt.n_batch, 0, 1);
    if (opt.links) {
      const relokv_engine::link_adapter& a = *opt.links;
      // llama.cpp takes input embeddings (llama_batch.embd) and computes every layer from
      // them; no call of its API writes one layer's K/V of a position, so a deep adapter
      // (per-layer K/V) cannot be served here.
      if (a.deep)
        throw std::invalid_argument("llama.cpp engine: the span-link adapter '" + a.path +
                                    "' is deep (per-layer K/V, relokv.links.depth kv); "
                                    "llama.cpp reads only embedding rows: serve it with "
                                    "relokv's own engine");
      if (a.lowrank > 0)
        throw std::invalid_argument("llama.cpp engine: the span-link adapter '" + a.path +
                                    "' holds a low-rank correction of span K/V "
                                    "(relokv.links.lowrank_rank); llama.cpp computes a layer's "
                                    "K/V itself: serve it with relokv's own engine");
      if (a.dim != llama_model_n_embd(model) || a.n < 1 ||
          a.rows.size() != static_cast<std::size_t>(a.n) * static_cast<std::size_t>(a.dim))
        throw std::invalid_argument("llama.cpp engine: the span-link adapter '" + a.path +
                                    "' has rows of " + std::to_string(a.dim) +
                                    " values, this model embeds in " +
                                    std::to_string(llama_model_n_embd(model)));
      rows_batch = llama_batch_init(opt.n_batch, a.dim, 1);
    }
    // One token decoded and read back: the image format, the row size (so the head size) and
    // whether V is held transposed, checked before any request relies on them.
    const relokv::token_t probe = 0;
    decode_run(std::span<const relokv::token_t>(&probe, 1), 0, false);
    const seq_image im = read_image(kRequestSeq);
    if (im.cells() != 1 || im.pos(0) != 0)
      throw std::runtime_error("llama.cpp engine: the probe's image does not hold its one cell");
    v_trans = im.v_trans();
    clear();
    // The fingerprint of stored blocks: the file, llama.cpp's KV type and the placement.
    struct {
      std::uint64_t file;
      std::int32_t type;
      char engine[12];
    } id{file_id(path), context::kv_type_of<T>, "llama.cpp"};
    relokv::rope_config rope;
    rope.head_dim = head_dim;
    rope.rotary_dim = head_dim;
    fingerprint =
        relokv::store_fingerprint(XXH3_64bits(&id, sizeof id), rope, relokv::pre_rotated::kind);
    pool.emplace(relokv::kv_shape{layers, opt.num_blocks, kv_heads, opt.block_size, head_dim});
    if (!opt.store) {
      cache.emplace(relokv::lru_block_pool(opt.num_blocks), opt.block_size);
    } else {
      const relokv::store_options so{fingerprint, pool->block_layout()};
      cache.emplace(relokv::lru_block_pool(opt.num_blocks), opt.block_size, relokv::xxh3_128(),
                    relokv::recompute::any_strategy(), std::move(opt.store), so);
    }
  }

  void clear() noexcept {
    for (llama_seq_id s = 0; s < kSeqs; ++s) (void)llama_memory_seq_rm(mem, s, -1, -1);
  }

  /// Decodes tokens at positions p0.. into the request's sequence, in batches of n_batch; the
  /// last token's logits are kept when `logits`. A run of adapter ids (>= vocab) goes as rows.
  void decode_run(std::span<const relokv::token_t> tokens, std::int32_t p0, bool logits) {
    for (std::size_t i = 0; i < tokens.size();) {
      const bool rows = tokens[i] >= vocab;
      std::size_t n = 0;
      while (i + n < tokens.size() && n < static_cast<std::size_t>(opt.n_batch) &&
             (tokens[i + n] >= vocab) == rows)
        ++n;
      llama_batch& b = rows ? rows_batch : batch;
      for (std::size_t j = 0; j < n; ++j) {
        if (rows) {
          const auto dim = static_cast<std::size_t>(opt.links->dim);
          const auto r = static_cast<std::size_t>(tokens[i + j] - vocab);
          std::memcpy(b.embd + j * dim, opt.links->rows.data() + r * dim, dim * sizeof(float));
        } else {
          b.token[j] = tokens[i + j];
        }
        b.pos[j] = p0 + static_cast<std::int32_t>(i + j);
        b.n_seq_id[j] = 1;
        b.seq_id[j][0] = kRequestSeq;
        b.logits[j] = logits && i + j + 1 == tokens.size();
      }
      b.n_tokens = static_cast<std::int32_t>(n);
      const std::int32_t rc = llama_decode(ctx, b);
      if (rc != 0)
        throw std::runtime_error("llama.cpp engine: llama_decode failed at position " +
                                 std::to_string(p0 + static_cast<std::int32_t>(i)) + ": " +
                                 context::decode_error(rc));
      if (window > 0)
        llama_memory_seq_cp(mem, kRequestSeq, kPinSeq, p0 + static_cast<std::int32_t>(i),
                            p0 + static_cast<std::int32_t>(i + n));
      i += n;
    }
  }

  std::vector<float> last_logits() const {
    const float* l = llama_get_logits_ith(ctx, -1);
    if (l == nullptr) throw std::runtime_error("llama.cpp engine: no logits");
    return {l, l + vocab};
  }

  seq_image read_image(llama_seq_id seq) const {
    std::vector<std::uint8_t> bytes(llama_state_seq_get_size(ctx, seq));
    const std::size_t got = llama_state_seq_get_data(ctx, bytes.data(), bytes.size(), seq);
    if (got != bytes.size())
      throw std::runtime_error("llama.cpp engine: the sequence image is " + std::to_string(got) +
                               " bytes, llama.cpp announced " + std::to_string(bytes.size()));
    return seq_image::parse(std::move(bytes), geo);
  }

  /// Ids in [0, vocab), and the adapter's rows' ids after them when there is one.
  void check_tokens(std::span<const relokv::token_t> t, const char* where) const {
    const std::int32_t end = vocab + (opt.links ? opt.links->n : 0);
    for (std::size_t i = 0; i < t.size(); ++i)
      if (t[i] < 0 || t[i] >= end)
        throw std::invalid_argument(
            std::string(where) + ": token " + std::to_string(i) + " = " + std::to_string(t[i]) +
            " outside the vocabulary [0, " + std::to_string(vocab) + ")" +
            (opt.links ? " and the adapter's " + std::to_string(opt.links->n) + " rows after it"
                       : std::string()));
  }

  /// Loads groups [g, end) (up to kSeqs - 2) into sequences 1.., each at its stored positions,
  /// then shifts each by its delta: llama.cpp re-rotates the keys at its next decode.
  void load_wave(std::vector<load_group>& groups, std::size_t g, const relokv::reuse_plan& plan,
                 const std::vector<std::int32_t>& stored, const std::vector<std::uint8_t>& comp) {
    const auto hd = static_cast<std::size_t>(head_dim);
    for (std::size_t i = g; i < groups.size() && i - g < kSeqs - 2; ++i) {
      load_group& lg = groups[i];
      lg.seq = static_cast<llama_seq_id>(1 + i - g);
      std::vector<std::int32_t> pos;
      std::vector<std::pair<relokv::block_id, std::int32_t>> at;  // (block, slot) per cell
      for (std::int32_t b = lg.first_block; b <= lg.last_block; ++b) {
        const relokv::planned_block& pb = plan.blocks[static_cast<std::size_t>(b)];
        for (std::int32_t s = 0; s < pb.len; ++s)
          if (!comp[static_cast<std::size_t>(pb.pos0 + s)]) {
            pos.push_back(stored[static_cast<std::size_t>(b)] + s);
            at.emplace_back(pb.physical, s);
          }
      }
      const auto rows = [&](std::int32_t l, std::int32_t cell, bool v, std::byte* out) {
        const auto [blk, slot] = at[static_cast<std::size_t>(cell)];
        for (std::int32_t h = 0; h < kv_heads; ++h) {
          const T* src = pool->tile(l, blk, v ? 1 : 0, h) + static_cast<std::size_t>(slot) * hd;
          std::memcpy(out + static_cast<std::size_t>(h) * hd * sizeof(T), src, hd * sizeof(T));
        }
      };
      const auto image = write_image(pos, lg.seq, v_trans, geo, rows);
      if (llama_state_seq_set_data(ctx, image.data(), image.size(), lg.seq) != image.size())
        throw std::runtime_error("llama.cpp engine: llama.cpp did not take a span's " +
                                 std::to_string(pos.size()) + " cells (context of " +
                                 std::to_string(opt.n_ctx) + ")");
      if (window > 0) llama_memory_seq_cp(mem, lg.seq, kPinSeq, -1, -1);
      if (lg.delta != 0) llama_memory_seq_add(mem, lg.seq, -1, -1, lg.delta);
    }
  }

  /// Prepares a planned prompt's walk (its fetches written, its copies made, the cached runs
  /// grouped); computes nothing. `stats` gets the plan's counts.
  prompt_walk begin(const relokv::request_layout& layout, relokv::reuse_plan& plan,
                    relokv_engine::prefill_stats* stats) {
    relokv::apply_fetches(*pool, plan.fetches);
    plan.fetches.clear();
    const std::size_t nb = plan.blocks.size();
    prompt_walk w;
    w.tokens = layout.tokens;
    // Where each block's keys were computed: its position, or a copy's source position (the
    // copy is made raw; llama.cpp's K-shift rotates).
    w.stored.resize(nb);
    for (std::size_t b = 0; b < nb; ++b) w.stored[b] = plan.blocks[b].pos0;
    for (const relokv::block_copy& c : plan.copies) {
      for (std::size_t b = 0; b < nb; ++b)
        if (plan.blocks[b].physical == c.dst) w.stored[b] = c.src_pos0;
      if (c.src != c.dst) pool->copy_block(c.src, c.dst);
    }
    const auto n = static_cast<std::int32_t>(layout.tokens.size());
    // Computed tokens: the plan's, and the last one (it gives the logits; llama.cpp writes its
    // K/V, so it is not loaded).
    w.comp.assign(plan.compute.begin(), plan.compute.end());
    w.comp[static_cast<std::size_t>(n - 1)] = 1;
    w.group_of.assign(static_cast<std::size_t>(n), -1);
    for (std::size_t b = 0; b < nb; ++b) {
      const relokv::planned_block& pb = plan.blocks[b];
      bool any = false;
      for (std::int32_t s = 0; s < pb.len; ++s)
        any |= !w.comp[static_cast<std::size_t>(pb.pos0 + s)];
      if (!any) continue;
      const std::int32_t delta = pb.pos0 - w.stored[b];
      const auto bi = static_cast<std::int32_t>(b);
      if (w.groups.empty() || w.groups.back().last_block != bi - 1 ||
          w.groups.back().delta != delta || w.stored[b - 1] + plan.blocks[b - 1].len != w.stored[b])
        w.groups.push_back({bi, bi, delta, -1, 0});
      else
        w.groups.back().last_block = bi;
      for (std::int32_t s = 0; s < pb.len; ++s)
        if (!w.comp[static_cast<std::size_t>(pb.pos0 + s)]) {
          w.group_of[static_cast<std::size_t>(pb.pos0 + s)] =
              static_cast<std::int32_t>(w.groups.size() - 1);
          w.groups.back().last_pos = pb.pos0 + s;
        }
    }
    if (stats != nullptr) {
      *stats = {};
      stats->tokens = n;
      stats->computed = static_cast<std::int32_t>(std::count(w.comp.begin(), w.comp.end(), 1));
      stats->exact_hits = plan.exact_hits;
      stats->relocated_hits = plan.relocated_hits;
      stats->misses = plan.misses;
      stats->store_hits = plan.store_hits;
      for (const relokv::planned_block& pb : plan.blocks) {
        stats->pool_blocks += pb.tier == relokv::block_tier::kPool;
        stats->store_blocks += pb.tier == relokv::block_tier::kStore;
        stats->computed_blocks += pb.tier == relokv::block_tier::kComputed;
      }
    }
    return w;
  }

  /// Walks the prompt on in position order (llama.cpp appends only after the last position):
  /// cached runs shared into the request's sequence (no rows), computed runs decoded, at most
  /// `max_rows` of them. True once the prompt is done (its last token's logits are llama.cpp's
  /// last). `stats`, when given, gets the work added.
  bool advance(prompt_walk& w, const relokv::reuse_plan& plan, std::int32_t max_rows,
               relokv_engine::prefill_stats* stats) {
    const auto n = static_cast<std::int32_t>(w.tokens.size());
    std::int32_t rows = 0;
    while (w.p < n) {
      const std::int32_t p = w.p;
      std::int32_t q = p + 1;
      if (w.comp[static_cast<std::size_t>(p)]) {
        if (rows >= max_rows) break;
        while (q < n && w.comp[static_cast<std::size_t>(q)] && q - p < max_rows - rows) ++q;
        decode_run(std::span(w.tokens).subspan(static_cast<std::size_t>(p),
                                               static_cast<std::size_t>(q - p)),
                   p, q == n);
        rows += q - p;
      } else {
        const std::int32_t g = w.group_of[static_cast<std::size_t>(p)];
        while (q < n && w.group_of[static_cast<std::size_t>(q)] == g) ++q;
        load_group& lg = w.groups[static_cast<std::size_t>(g)];
        if (lg.seq < 0) load_wave(w.groups, static_cast<std::size_t>(g), plan, w.stored, w.comp);
        llama_memory_seq_cp(mem, lg.seq, kRequestSeq, p, q);
        if (q - 1 == lg.last_pos) (void)llama_memory_seq_rm(mem, lg.seq, -1, -1);
      }
      w.p = q;
    }
    if (stats != nullptr) stats->token_layers += static_cast<std::int64_t>(rows) * layers;
    return w.p == n;
  }

  /// The request's private blocks (computed, or relocated copies), from llama.cpp into the pool.
  /// A sliding-window model's windowed layers export only the cells within a window of the
  /// sequence's last position: the request is read a window of positions at a time, each
  /// copied into a scratch sequence (which shares the cells) whose last position ends it.
  void write_back(const relokv::reuse_plan& plan) {
    const std::int32_t n = live->n_tokens;
    const std::int32_t step = window > 0 ? window : std::max<std::int32_t>(n, 1);
    for (std::int32_t a = 0; a < n; a += step) {
      const std::int32_t b = std::min(n, a + step);
      if (window > 0) {
        constexpr llama_seq_id kScratch = 1;
        (void)llama_memory_seq_rm(mem, kScratch, -1, -1);
        llama_memory_seq_cp(mem, kRequestSeq, kScratch, a, b);
        const seq_image im = read_image(kScratch);
        (void)llama_memory_seq_rm(mem, kScratch, -1, -1);
        write_back_range(plan, im, a, b);
      } else {
        write_back_range(plan, read_image(kRequestSeq), a, b);
      }
    }
  }

  /// The private blocks' rows at positions [a, b) from an image that holds them.
  void write_back_range(const relokv::reuse_plan& plan, const seq_image& im, std::int32_t a,
                        std::int32_t b) {
    std::vector<std::int32_t> cell_of(static_cast<std::size_t>(live->n_tokens), -1);
    for (std::int32_t c = 0; c < im.cells(); ++c)
      if (im.pos(c) >= 0 && im.pos(c) < live->n_tokens)
        cell_of[static_cast<std::size_t>(im.pos(c))] = c;
    const auto hd = static_cast<std::size_t>(head_dim);
    std::vector<std::byte> row(geo.row_bytes());
    for (const relokv::planned_block& pb : plan.blocks) {
      if (!pb.fresh && !pb.copy_on_write) continue;
      for (std::int32_t s = 0; s < pb.len; ++s) {
        if (pb.pos0 + s < a || pb.pos0 + s >= b) continue;
        const std::int32_t c = cell_of[static_cast<std::size_t>(pb.pos0 + s)];
        if (c < 0)
          throw std::logic_error("llama.cpp engine: position " + std::to_string(pb.pos0 + s) +
                                 " is missing from the context");
        for (std::int32_t l = 0; l < layers; ++l)
          for (int v = 0; v < 2; ++v) {
            im.row(l, c, v == 1, row.data());
            for (std::int32_t h = 0; h < kv_heads; ++h)
              std::memcpy(pool->tile(l, pb.physical, v, h) + static_cast<std::size_t>(s) * hd,
                          row.data() + static_cast<std::size_t>(h) * hd * sizeof(T),
                          hd * sizeof(T));
          }
      }
    }
  }
};

}  // namespace relokv_llama_cpp
