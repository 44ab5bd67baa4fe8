// Encode and decode with SentencePiece-style BPE, both builds (loaded once from the Gemma 3
// family fixture, tests/fixtures/families/gemma3/tokenizer.json): merges by rank as
// tokenizer.json gives them, and (flag kAlternate) merges by score as a GGUF file gives them,
// with the same vocabulary, scores falling with the id as in Gemma's files. The input is a
// flags byte, then text to encode or ids to decode (EncodeInput).
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "fuzz_util.h"
#include "tokenizer/spm_model.h"
#include "tokenizer_checks.h"

namespace {

constexpr const char* kFixture = "tests/fixtures/families/gemma3/tokenizer.json";

// The fixture's vocabulary as a GGUF file of model "llama" describes it.
llmk::Tokenizer by_scores() {
  std::ifstream in(llmk::fuzz::source_path(kFixture), std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json root = nlohmann::json::parse(text.str());
  llmk::TokenizerData d;
  d.model = "llama";
  const nlohmann::json& vocab = root.at("model").at("vocab");
  d.tokens.resize(vocab.size());
  for (const auto& [token, id] : vocab.items()) d.tokens.at(id.get<size_t>()) = token;
  d.token_types.assign(d.tokens.size(), static_cast<int32_t>(llmk::TokenType::Normal));
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    d.scores.push_back(-static_cast<float>(i));
    if (llmk::SpmModel::byte_token_value(d.tokens[i]) >= 0) {
      d.token_types[i] = static_cast<int32_t>(llmk::TokenType::Byte);
    }
  }
  for (const nlohmann::json& added : root.at("added_tokens")) {
    const size_t id = added.at("id").get<size_t>();
    d.token_types.at(id) = static_cast<int32_t>(
        added.at("special").get<bool>() ? llmk::TokenType::Control : llmk::TokenType::UserDefined);
  }
  const auto id_of = [&](const char* token) {
    return vocab.contains(token) ? vocab.at(token).get<int32_t>() : -1;
  };
  d.bos_id = id_of("<bos>");
  d.eos_id = id_of("<eos>");
  d.unk_id = id_of("<unk>");
  d.pad_id = id_of("<pad>");
  return llmk::Tokenizer::from_data(std::move(d));
}

const llmk::Tokenizer* by_merges_tok = nullptr;
const llmk::Tokenizer* by_scores_tok = nullptr;

}  // namespace

// Loaded before the first input, so that the load does not count against -timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  by_merges_tok =
      new llmk::Tokenizer(llmk::Tokenizer::from_hf_json(llmk::fuzz::source_path(kFixture)));
  by_scores_tok = new llmk::Tokenizer(by_scores());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const llmk::fuzz::EncodeInput in(data, size);
  const llmk::Tokenizer& tok =
      *((in.flags & llmk::fuzz::EncodeInput::kAlternate) ? by_scores_tok : by_merges_tok);
  if (in.flags & llmk::fuzz::EncodeInput::kDecodeIds) {
    llmk::fuzz::decode_ids(tok, in);
  } else {
    llmk::fuzz::encode_all_ways(tok, in.rest);
  }
  return 0;
}
