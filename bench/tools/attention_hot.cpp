// A/B timing of the host attention headers, hot in cache: build it twice against two include
// trees and alternate the binaries (bench/results/host-2026-12-01d.md), for example
//   g++ -std=c++20 -O3 -DNDEBUG -march=native -I OLD/include bench/tools/attention_hot.cpp -o old
//   g++ -std=c++20 -O3 -DNDEBUG -march=native -I include bench/tools/attention_hot.cpp -o new
//   for i in 1 2 3; do setarch x86_64 -R ./old; setarch x86_64 -R ./new; done
//
// Hot-cache host attention timing, one thread: decode (1 query) and prefill (16 queries) over
// 64 blocks of 16 slots, 8 query heads / 2 KV heads, head_dim 64; fp32 and bf16 KV; the three
// placements. Prints median ns per call over 2000 calls.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <relokv/attention/host_attention.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/pre_rotated.hpp>
#include <vector>
template <class P, class T>
double run(const char* name) {
  relokv::rope_config c;
  c.head_dim = c.rotary_dim = 64;
  const relokv::rope_table rope(c, 4096);
  relokv::host_kv_storage<T> st(relokv::kv_shape{1, 64, 2, 16, 64});
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  auto v = st.layer(0);
  for (int b = 0; b < 64; ++b)
    for (int h = 0; h < 2; ++h)
      for (long i = 0; i < v.tile_elems(); ++i) {
        v.k(b, h)[i] = relokv::from_f32<T>(nd(rng));
        v.v(b, h)[i] = relokv::from_f32<T>(nd(rng));
      }
  std::vector<relokv::block_entry> table;
  for (int b = 0; b < 64; ++b) table.push_back({(b * 37) % 64, b * 16, 16});
  const std::int32_t indptr[2] = {0, 64};
  std::vector<float> q(16 * 8 * 64), out(q.size());
  for (auto& x : q) x = nd(rng);
  std::vector<relokv::pos_t> pos(16);
  for (int i = 0; i < 16; ++i) pos[i] = 1000 + i * 1;
  const std::int32_t qi[2] = {0, 16};
  std::vector<double> td, tp;
  for (int it = 0; it < 2000; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    relokv::decode_attention<P>(rope, st.layer(0), {table.data(), indptr, 1}, q.data(), &pos[15], 8,
                                0.125f, out.data());
    auto t1 = std::chrono::steady_clock::now();
    if (it % 4 == 0)
      relokv::prefill_attention<P>(rope, st.layer(0), {table.data(), indptr, 1}, q.data(),
                                   pos.data(), qi, 8, 0.125f, out.data());
    auto t2 = std::chrono::steady_clock::now();
    td.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    if (it % 4 == 0) tp.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count());
  }
  std::nth_element(td.begin(), td.begin() + td.size() / 2, td.end());
  std::nth_element(tp.begin(), tp.begin() + tp.size() / 2, tp.end());
  std::printf("%s decode %.0f prefill16 %.0f\n", name, td[td.size() / 2], tp[tp.size() / 2]);
  return out[0];
}
int main() {
  double s = 0;
  s += run<relokv::pre_rotated, float>("pre_rotated f32");
  s += run<relokv::at_attention, float>("at_attention f32");
  s += run<relokv::block_relative, float>("block_relative f32");
  s += run<relokv::pre_rotated, relokv::bf16>("pre_rotated bf16");
  s += run<relokv::at_attention, relokv::bf16>("at_attention bf16");
  s += run<relokv::block_relative, relokv::bf16>("block_relative bf16");
  std::printf("# %g\n", s);
}
