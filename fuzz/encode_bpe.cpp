// Encode and decode with byte-level BPE (SmolLM2's tokenizer.json from tests/fixtures, loaded
// once): the input is a flags byte, then text to encode or ids to decode (EncodeInput). Byte-level
// BPE without a normalizer must give back the text exactly, less the bytes the vocabulary has no
// token for (SmolLM2 lacks a few; encode drops them, as tokenizers does).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "tokenizer_checks.h"

namespace {

const llmk::Tokenizer* tokenizer = nullptr;
std::array<bool, 256> dropped{};  // bytes without a token

std::string without_dropped(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (!dropped[static_cast<uint8_t>(c)]) out += c;
  }
  return out;
}

}  // namespace

// Loaded before the first input, so that the load does not count against -timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer = new llmk::Tokenizer(llmk::Tokenizer::from_hf_json(
      llmk::fuzz::source_path("tests/fixtures/tokenizer/hf_json/smollm2")));
  for (int b = 0; b < 256; ++b) {
    dropped[b] = tokenizer->encode(std::string(1, static_cast<char>(b)), false, false).empty();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const llmk::Tokenizer& tok = *tokenizer;
  const llmk::fuzz::EncodeInput in(data, size);
  if (in.flags & llmk::fuzz::EncodeInput::kDecodeIds) {
    llmk::fuzz::decode_ids(tok, in);
    return 0;
  }
  const std::vector<int32_t> ids = llmk::fuzz::encode_all_ways(tok, in.rest);
  llmk::fuzz::check(tok.decode(ids) == without_dropped(in.rest),
                    "decode(encode(text)) differs from the text");
  return 0;
}
