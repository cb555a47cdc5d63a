// A token_slot is made only by request_kv: an engine cannot forge one that writes (into a
// shared block, say). The control compiles; -DRELOKV_BREAK_SLOT must not.
#include <relokv/engine/request_kv.hpp>

int main() {
  const relokv::token_slot s;  // an empty slot: it writes nothing
#ifdef RELOKV_BREAK_SLOT
  relokv::token_slot forged{0, 0, 0, true};  // position, block, slot, write
  return forged.writes() ? 1 : 0;
#else
  return s.writes() ? 1 : 0;
#endif
}
