// A consumer of the Redis component: any_store opens a redis:// URL, and a port nobody
// listens on gives an unavailable store, not an error.
#include <relokv/store/any_store.hpp>

#include <cstdio>

int main() {
  auto s = relokv::any_store::from_url("redis://127.0.0.1:1");
  std::vector<relokv::store_blob> out;
  const relokv::store_key k[] = {{1, 2}};
  if (s.get(k, out) != relokv::store_status::kUnavailable || out.size() != 1) {
    std::puts("expected an unavailable store");
    return 1;
  }
  std::puts("relokv::redis consumer ok");
  return 0;
}
