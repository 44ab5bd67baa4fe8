// SentencePiece-style BPE with byte fallback (tokenizer.ggml.model = "llama", as Gemma and
// Llama 2 ship it). Spaces become U+2581 "▁" (no prefix space is added), the text is cut into
// UTF-8 characters, and adjacent pieces merge while their concatenation is a token: the merge
// whose token ranks best goes first; among merges into the same token the longer left part, then
// the leftmost. A character with no token of its own becomes its byte tokens "<0xXX>" and takes
// part in no merge.
//
// The rank is the token's score, as in llama.cpp's llm_tokenizer_spm, except where the scores of
// the normal tokens fall strictly with their id (vocabularies stored in merge order, as Gemma's
// are): then it is the id, lower first. That agrees with the scores on normal tokens and also
// ranks the user-defined ones, to which Gemma gives a placeholder score of -1000. User-defined
// tokens made of spaces only ("  ", ...) are normal tokens spelled with "▁" here (they are not
// matched in the raw text; see is_space_run). This is what transformers builds from a Gemma GGUF
// (BPE with byte_fallback, merges generated from the vocabulary), so ids agree with it.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace llmk {

class SpmModel {
 public:
  SpmModel() = default;
  // tokens, scores, types: the vocabulary, one entry per id (scores empty: all 0). Merges
  // produce normal and user-defined tokens only, never control, byte, unknown or unused ones.
  // Bytes without a "<0xXX>" token fall back to unk_id (dropped when it is -1).
  SpmModel(std::span<const std::string> tokens, std::span<const float> scores,
           std::span<const TokenType> types, int32_t unk_id);

  // The byte a token spelled "<0xXX>" (SentencePiece's and tokenizers' byte-fallback tokens)
  // stands for, or -1.
  static int byte_token_value(std::string_view text);
  // The bytes a token stands for: "▁" is a space, "<0xXX>" byte tokens their byte, control and
  // user-defined tokens their text.
  static std::string token_bytes(std::string_view text, TokenType type);
  // A user-defined token of spaces only: merged to (as "▁▁..."), not cut out of the text before
  // encoding as other user-defined tokens are.
  static bool is_space_run(std::string_view text, TokenType type);

  // Reusable buffers, so that encoding many stretches allocates once.
  struct Scratch {
    struct Symbol {
      uint32_t begin, size;  // bytes of `text`
      int32_t id;            // -1: no token, written as byte tokens
      int32_t prev, next;    // indices into symbols; -1 at the ends
    };
    struct Candidate {
      float rank;          // of the result; higher first
      int32_t left;        // index of the left symbol
      uint32_t left_size;  // bytes of the left symbol
      uint32_t size;       // bytes of the merged text, to tell stale candidates
      int32_t result;      // token id
    };
    std::string text;  // the input with spaces escaped
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  // Appends the ids of `text` (any bytes; it holds no special token) to `out`.
  void encode(std::string_view text, Scratch& scratch, std::vector<int32_t>& out) const;

 private:
  // Open-addressing table from token text to id (mergeable tokens only).
  struct Slot {
    uint32_t hash = 0;
    int32_t id = -1;
  };
  int32_t find(std::string_view text) const;
  std::string_view key_of(int32_t id) const {
    return std::string_view(arena_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  void append_bytes(std::string_view text, std::vector<int32_t>& out) const;

  std::string arena_;              // all token texts as looked up (see is_space_run), back to back
  std::vector<uint32_t> offsets_;  // [vocab + 1]: token id's text is arena_[offsets_[id], ...)
  std::vector<float> ranks_;       // [vocab]: the scores, or -id (see above)
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  std::array<int32_t, 256> byte_ids_{};
};

}  // namespace llmk
