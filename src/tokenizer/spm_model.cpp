#include "tokenizer/spm_model.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "core/error.h"
#include "core/text.h"
#include "tokenizer/utf8.h"

namespace llmk {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

uint32_t hash_text(std::string_view s) {  // FNV-1a, then a final mix: texts are short
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  h ^= h >> 32;
  return static_cast<uint32_t>(h);
}

bool mergeable(TokenType t) { return t == TokenType::Normal || t == TokenType::UserDefined; }

// Max-heap order: the best rank first, then the longer left part (the order of transformers'
// generated merges for one token), then the leftmost symbol.
bool later(const SpmModel::Scratch::Candidate& a, const SpmModel::Scratch::Candidate& b) {
  if (a.rank != b.rank) return a.rank < b.rank;
  if (a.left_size != b.left_size) return a.left_size < b.left_size;
  return a.left > b.left;
}

}  // namespace

int SpmModel::byte_token_value(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

SpmModel::SpmModel(std::span<const std::string> tokens, std::span<const float> scores,
                   std::span<const TokenType> types, int32_t unk_id) {
  const size_t n = tokens.size();
  LLMK_CHECK(types.size() == n, "spm: {} token types for {} tokens", types.size(), n);
  LLMK_CHECK(scores.empty() || scores.size() == n, "spm: {} scores for {} tokens", scores.size(),
             n);
  size_t total = 0;
  for (const std::string& t : tokens) total += t.size() * kSpace.size();
  LLMK_CHECK(total < std::numeric_limits<uint32_t>::max(), "spm: token texts too long");
  arena_.reserve(total / 2);
  offsets_.reserve(n + 1);
  for (size_t i = 0; i < n; ++i) {
    offsets_.push_back(static_cast<uint32_t>(arena_.size()));
    if (is_space_run(tokens[i], types[i])) {
      for (size_t k = 0; k < tokens[i].size(); ++k) arena_ += kSpace;
    } else {
      arena_ += tokens[i];
    }
  }
  offsets_.push_back(static_cast<uint32_t>(arena_.size()));

  ranks_.assign(scores.begin(), scores.end());
  ranks_.resize(n, 0.0f);
  bool falling = true;  // the scores of normal tokens fall strictly with the id
  float last = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n && falling; ++i) {
    if (types[i] != TokenType::Normal) continue;
    falling = ranks_[i] < last;
    last = ranks_[i];
  }
  if (falling) {
    for (size_t i = 0; i < n; ++i) ranks_[i] = -static_cast<float>(i);
  }

  byte_ids_.fill(unk_id);
  const size_t capacity = std::bit_ceil(std::max<size_t>(16, n * 2));
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    if (types[i] == TokenType::Byte) {
      const int b = byte_token_value(tokens[i]);
      LLMK_CHECK(b >= 0, "spm: byte token {} is '{}', expected <0xXX>", i, printable(tokens[i]));
      byte_ids_[b] = id;
      continue;
    }
    const std::string_view key = key_of(id);
    if (!mergeable(types[i]) || key.empty()) continue;
    const uint32_t h = hash_text(key);
    for (uint64_t k = h & mask_;; k = (k + 1) & mask_) {
      Slot& s = slots_[k];
      if (s.id < 0) {
        s = Slot{h, id};
        break;
      }
      if (s.hash == h && key_of(s.id) == key) break;  // the first of duplicates wins
    }
  }
}

int32_t SpmModel::find(std::string_view text) const {
  const uint32_t h = hash_text(text);
  for (uint64_t k = h & mask_;; k = (k + 1) & mask_) {
    const Slot& s = slots_[k];
    if (s.id < 0) return -1;
    if (s.hash == h && key_of(s.id) == text) return s.id;
  }
}

bool SpmModel::is_space_run(std::string_view text, TokenType type) {
  return type == TokenType::UserDefined && !text.empty() &&
         text.find_first_not_of(' ') == std::string_view::npos;
}

std::string SpmModel::token_bytes(std::string_view text, TokenType type) {
  if (type == TokenType::Control || type == TokenType::UserDefined) return std::string(text);
  if (type == TokenType::Byte) {
    const int b = byte_token_value(text);
    if (b >= 0) return std::string(1, static_cast<char>(b));
  }
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.substr(i, kSpace.size()) == kSpace) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

void SpmModel::append_bytes(std::string_view text, std::vector<int32_t>& out) const {
  for (char c : text) {
    const int32_t id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) out.push_back(id);
  }
}

void SpmModel::encode(std::string_view input, Scratch& scratch, std::vector<int32_t>& out) const {
  std::string& text = scratch.text;
  auto& symbols = scratch.symbols;
  auto& heap = scratch.heap;
  text.clear();
  symbols.clear();
  heap.clear();
  for (char c : input) {
    if (c == ' ') {
      text += kSpace;
    } else {
      text += c;
    }
  }
  LLMK_CHECK(text.size() < std::numeric_limits<int32_t>::max(), "spm: text too long ({} bytes)",
             text.size());

  // One symbol per UTF-8 character (an invalid byte is a character of its own).
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = std::max<size_t>(1, utf8::sequence_length(text, pos));
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(len),
                       find(std::string_view(text).substr(pos, len)), n - 1, n + 1});
    pos += len;
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  const auto push_pair = [&](int32_t left) {
    const Scratch::Symbol& l = symbols[left];
    if (l.next < 0 || l.id < 0) return;
    const Scratch::Symbol& r = symbols[l.next];
    if (r.id < 0) return;
    const int32_t id = find(std::string_view(text).substr(l.begin, l.size + r.size));
    if (id < 0) return;
    heap.push_back({ranks_[id], left, l.size, l.size + r.size, id});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Scratch::Candidate top = heap.back();
    heap.pop_back();
    Scratch::Symbol& left = symbols[top.left];
    // A candidate is stale when either symbol merged with another neighbour first: the merged
    // text would no longer have the size recorded (symbols only grow; a merged-away symbol has
    // size 0).
    if (left.size == 0 || left.next < 0) continue;
    Scratch::Symbol& right = symbols[left.next];
    if (left.size + right.size != top.size) continue;
    left.size += right.size;
    left.id = top.result;
    right.size = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.left);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const Scratch::Symbol& s = symbols[i];
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {
      append_bytes(std::string_view(text).substr(s.begin, s.size), out);
    }
  }
}

}  // namespace llmk
