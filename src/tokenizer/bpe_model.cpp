#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <bit>
#include <utility>

#include "tokenizer/utf8.h"

namespace llmk {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Min-heap order: lower rank first, then the leftmost position.
bool later(const BpeModel::Scratch::Candidate& a, const BpeModel::Scratch::Candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

}  // namespace

BpeModel::BpeModel(const std::array<int32_t, 256>& byte_ids, std::span<const Merge> merges)
    : byte_ids_(byte_ids) {
  const size_t capacity = std::bit_ceil(std::max<size_t>(16, merges.size() * 2));
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Merge& m = merges[rank];
    const uint64_t key = pair_key(m.left, m.right);
    for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == key) break;  // listed before: keep the lower rank
      if (s.key == kEmpty) {
        s = Slot{key, static_cast<int32_t>(rank), m.result};
        break;
      }
    }
  }
}

BpeModel::BpeModel(std::unordered_map<uint32_t, int32_t> char_ids,
                   const std::array<int32_t, 256>& byte_ids, std::span<const Merge> merges)
    : BpeModel(byte_ids, merges) {
  by_character_ = true;
  char_ids_ = std::move(char_ids);
}

uint32_t BpeModel::char_key(std::string_view character) {
  uint32_t key = 0;
  for (size_t i = 0; i < character.size() && i < 4; ++i) {
    key |= static_cast<uint32_t>(static_cast<unsigned char>(character[i])) << (8 * i);
  }
  return key;
}

void BpeModel::start_symbols(std::string_view piece, std::vector<Scratch::Symbol>& symbols) const {
  const auto add = [&](int32_t id) {
    if (id < 0) return;  // no token: dropped, its neighbours become adjacent
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, true});
  };
  if (!by_character_) {
    for (char c : piece) add(byte_ids_[static_cast<unsigned char>(c)]);
    return;
  }
  for (size_t pos = 0; pos < piece.size();) {
    const size_t len = utf8::sequence_length(piece, pos);  // 0: an invalid byte
    const std::string_view character = piece.substr(pos, std::max<size_t>(1, len));
    pos += character.size();
    if (len > 0) {
      if (const auto it = char_ids_.find(char_key(character)); it != char_ids_.end()) {
        add(it->second);
        continue;
      }
    }
    for (char c : character) add(byte_ids_[static_cast<unsigned char>(c)]);
  }
}

const BpeModel::Slot* BpeModel::find(int32_t a, int32_t b) const {
  const uint64_t key = pair_key(a, b);
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.key == key) return &s;
    if (s.key == kEmpty) return nullptr;
  }
}

void BpeModel::encode(std::string_view piece, Scratch& scratch, std::vector<int32_t>& out) const {
  auto& symbols = scratch.symbols;
  auto& heap = scratch.heap;
  symbols.clear();
  heap.clear();
  start_symbols(piece, symbols);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  const auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const Slot* s = find(symbols[pos].id, symbols[next].id)) {
      heap.push_back({s->rank, pos, s->result});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Scratch::Candidate top = heap.back();
    heap.pop_back();
    Scratch::Symbol& left = symbols[top.pos];
    // Candidates go stale when a neighbour merged first: the pair must still be there.
    if (!left.alive || left.next < 0) continue;
    Scratch::Symbol& right = symbols[left.next];
    const Slot* s = find(left.id, right.id);
    if (s == nullptr || s->result != top.result) continue;
    left.id = top.result;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace llmk
