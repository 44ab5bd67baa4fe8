// Pre-tokenizers: the regex splits that cut text into pieces before BPE, one table entry per
// `tokenizer.ggml.pre` value. An entry is a list of regexes applied in turn; each cuts every
// piece of the previous stage into its matches and the stretches between them (Hugging Face's
// Split with behavior "isolated"), so nothing is ever dropped. Regexes are PCRE2 with UTF and
// UCP, so \p{L}, \p{N} and \s follow PCRE2's Unicode tables.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llmk {

class PreTokenizer {
 public:
  // The entry named `name` (a tokenizer.ggml.pre value); throws llmk::Error naming it and
  // listing the supported names.
  static PreTokenizer create(std::string_view name);
  static std::vector<std::string_view> supported_names();

  const std::string& name() const { return name_; }
  // Whether BPE takes a piece that is itself a token whole instead of merging its bytes (the
  // tokenizer.json `ignore_merges` of this family; GGUF files do not store it).
  bool ignore_merges() const { return ignore_merges_; }

  // Appends the pieces of `text`, in order, as views into it. `text` must be valid UTF-8.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  struct Regex;
  std::string name_;
  bool ignore_merges_ = false;
  std::vector<std::shared_ptr<const Regex>> stages_;
};

}  // namespace llmk
