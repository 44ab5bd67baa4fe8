// BPE merging over token ids: a piece starts as one symbol per byte (byte-level BPE) or per
// UTF-8 character (BPE with byte fallback), and the pair of adjacent symbols with the lowest
// merge rank is merged until no mergeable pair is left; among pairs of equal rank the leftmost
// goes first. This is the order of Hugging Face tokenizers' BPE (word.rs merge_all) and of
// llama.cpp, so ids agree with both.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace llmk {

class BpeModel {
 public:
  struct Merge {
    int32_t left, right, result;  // token ids
  };

  BpeModel() = default;
  // byte_ids[b]: the token of the single byte b, or -1 where the vocabulary has none (such
  // bytes are dropped from the output, as Hugging Face and llama.cpp do). `merges` in rank
  // order; a pair listed twice keeps its first (lowest) rank.
  BpeModel(const std::array<int32_t, 256>& byte_ids, std::span<const Merge> merges);
  // Byte fallback (tokenizers' BPE with byte_fallback, as tokenizer.json files of SentencePiece
  // families have it): a piece starts as one symbol per UTF-8 character that is a token
  // (char_ids, keyed by char_key), and as the byte tokens byte_ids of each character that is not
  // and of each byte that is not valid UTF-8 (dropped where byte_ids has -1).
  BpeModel(std::unordered_map<uint32_t, int32_t> char_ids, const std::array<int32_t, 256>& byte_ids,
           std::span<const Merge> merges);
  // The key of one UTF-8 character (1 to 4 bytes) in char_ids: its bytes, packed.
  static uint32_t char_key(std::string_view character);

  // Reusable buffers, so that encoding many pieces allocates once.
  struct Scratch {
    struct Symbol {
      int32_t id;
      int32_t prev, next;  // indices into symbols; -1 at the ends
      bool alive;
    };
    struct Candidate {
      int32_t rank, pos, result;
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  // Appends the ids of `piece` (raw bytes) to `out`.
  void encode(std::string_view piece, Scratch& scratch, std::vector<int32_t>& out) const;

 private:
  // Open-addressing map from a pair of ids to (rank, result).
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0, result = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Slot* find(int32_t a, int32_t b) const;
  // Appends the first symbols of `piece` to `symbols`.
  void start_symbols(std::string_view piece, std::vector<Scratch::Symbol>& symbols) const;

  bool by_character_ = false;
  std::unordered_map<uint32_t, int32_t> char_ids_;
  std::array<int32_t, 256> byte_ids_{};
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
};

}  // namespace llmk
