// llmk::Tokenizer: byte-level BPE (tokenizer.ggml.model = "gpt2") as GGUF files describe it,
// and SentencePiece-style BPE with byte fallback ("llama", as Gemma ships it; see spm_model.h).
//
// encode: special tokens are cut out of the text first (control tokens only when asked,
// user-defined tokens always), then each stretch between them is normalized (tokenizer.json's
// normalizer: NFC, SentencePiece's "▁" for spaces), split by the pre-tokenizer named by
// tokenizer.ggml.pre, and each piece is merged by BPE. decode concatenates the bytes of each
// token, so it reproduces the input exactly where no normalizer changed it (bytes for which the
// vocabulary has no token are dropped by encode, as Hugging Face tokenizers and llama.cpp do).
//
// The core is built from a plain TokenizerData; from_gguf and from_hf_json only fill one in. A
// Tokenizer is immutable and cheap to copy (shared state); it may be used from several threads at
// once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/normalizer.h"

namespace llmk {

namespace gguf {
class File;
}

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

// Everything a tokenizer is built from, named after the GGUF keys (tokenizer.ggml.*).
struct TokenizerData {
  std::string model;                 // tokenizer.ggml.model: "gpt2" or "llama" (SentencePiece)
  std::string pre = "gpt2";          // tokenizer.ggml.pre (see PreTokenizer::supported_names)
  std::vector<std::string> tokens;   // token texts; normal tokens in GPT-2's byte alphabet
  std::vector<int32_t> token_types;  // TokenType values; empty means all Normal
  std::vector<std::string> merges;   // "left right", in rank order
  std::vector<float> scores;         // tokenizer.ggml.scores ("llama"); empty means all 0
  int32_t bos_id = -1;               // -1: none
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;       // tokenizer.ggml.add_bos_token
  std::string chat_template;  // tokenizer.chat_template (Jinja source), may be empty

  // Hugging Face tokenizer.json only (GGUF files leave these as they are):
  // applied to each stretch between the added tokens matched in the raw text, before splitting.
  Normalizer normalizer;
  // How added (control or user-defined) tokens are matched; those not listed are matched in the
  // raw text as they are. normalized: in the normalized text, after those matched in the raw
  // text. lstrip / rstrip: the token takes the whitespace before / after it along.
  struct AddedToken {
    int32_t id = -1;
    bool normalized = false;
    bool lstrip = false;
    bool rstrip = false;
  };
  std::vector<AddedToken> added_tokens;
  bool strip_space = false;  // decode drops one leading space (decoder Strip(" ", 1, 0))
  // "llama" with use_merges: tokenizers' Metaspace pre-tokenizer (split: false), after the
  // normalizer: spaces become "▁", and a "▁" goes before each non-empty stretch that does not
  // start with one (Always), or only before such a stretch at the start of the text (First).
  enum class Metaspace { None, Never, Always, First };
  Metaspace metaspace = Metaspace::None;
  // "llama": BPE by the ranks of `merges`, starting from characters with byte fallback
  // (tokenizer.json's BPE with byte_fallback), instead of SentencePiece merging by scores. The
  // text arrives with spaces already escaped by the normalizer.
  bool use_merges = false;
};

class Tokenizer {
 public:
  // Validates `data` and builds the tokenizer; throws llmk::Error naming what is wrong (an
  // unsupported model or pre-tokenizer, an id out of range, a merge of unknown tokens, ...).
  static Tokenizer from_data(TokenizerData data);
  // Reads the tokenizer.* keys of a GGUF file; errors name the file.
  static Tokenizer from_gguf(const gguf::File& file);
  // Reads a Hugging Face tokenizer.json (`path` is the file or a folder holding it) and the
  // tokenizer_config.json beside it: byte-level BPE (Llama 3, Qwen2, SmolLM2) or BPE with byte
  // fallback (SentencePiece-style: Llama 2, Phi-3, Gemma). Errors name the file and the key.
  static Tokenizer from_hf_json(const std::string& path);

  // Token ids of `text` (any bytes; invalid UTF-8 sequences are encoded byte by byte).
  // add_bos prepends bos_id() (an error when there is none) unless the text already starts with
  // it, as a chat template that writes "<bos>" does. parse_special: control tokens
  // written in the text (e.g. "<|im_start|>") become their ids; otherwise they are plain text.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;

  // The bytes of the tokens, concatenated (less one leading space where the tokenizer.json
  // decoder strips it). skip_special leaves out special tokens.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The bytes one token stands for (its text for control and user-defined tokens). May be an
  // incomplete UTF-8 character: streaming output must buffer until utf8::complete_prefix.
  const std::string& token_bytes(int32_t id) const;
  // The token's text as the vocabulary stores it (normal tokens in the byte alphabet: "Ġthe").
  const std::string& token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when the vocabulary has none
  int32_t eos_id() const;
  int32_t unk_id() const;
  int32_t pad_id() const;
  bool add_bos() const;
  // Control and unknown tokens: never produced from plain text, left out by skip_special.
  bool is_special(int32_t id) const;
  // Tokens that end a generated turn: eos, then whichever of <|im_end|>, <|endoftext|>,
  // <|eot_id|>, <|eom_id|>, <end_of_turn>, <|end|> the vocabulary has as a control or
  // user-defined token. No duplicates.
  std::vector<int32_t> end_of_generation_ids() const;
  // The id of the token whose stored text is exactly `text`.
  std::optional<int32_t> find_token(std::string_view text) const;
  const std::string& chat_template() const;
  const std::string& pre_tokenizer() const;
  // Everything the tokenizer was built from (llmk quantize writes it into GGUF files).
  const TokenizerData& data() const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace llmk
