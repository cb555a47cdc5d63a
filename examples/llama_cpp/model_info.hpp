#pragma once
// What the llama.cpp adapter reads of a model besides llama.cpp's own counts: the file's
// identity (the store fingerprint), its metadata as text, a head's width, and which layers a
// sliding-window model's sequence images hold (llama.cpp's public API does not say).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

struct llama_model;

namespace relokv_llama_cpp {

/// XXH3 of the GGUF file's bytes: the weights (and everything else the file says).
/// @throws std::runtime_error when the file cannot be read
std::uint64_t file_id(const std::string& path);

/// A metadata value of the model as text, or nullopt when the file has none.
std::optional<std::string> meta(const llama_model* m, const std::string& key);

/// A head's width: attention.key_length where the file has it (Gemma 3: 256 for a model width
/// of 640 over 4 heads), else the width over the heads.
std::int32_t head_width(const llama_model* m);

/// The images of a sequence's state (image_geometry::parts): none (one image of every layer),
/// or for a sliding-window model its global layers' then its windowed layers'. llama.cpp knows
/// which layers are windowed from the architecture's pattern; the adapter reads the metadata
/// llama.cpp reads (Gemma 3: layer l is windowed when l % pattern < pattern - 1, pattern 6
/// unless attention.sliding_window_pattern says).
/// @throws std::runtime_error for a sliding-window architecture whose pattern it does not know
std::vector<std::vector<std::int32_t>> image_parts(const llama_model* m, std::int32_t layers);

}  // namespace relokv_llama_cpp
