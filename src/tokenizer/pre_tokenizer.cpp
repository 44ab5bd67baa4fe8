#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pre_tokenizer.h"

#include <pcre2.h>

#include <array>
#include <span>
#include <string>

#include "core/error.h"
#include "core/text.h"

namespace llmk {
namespace {

// GPT-2's split, as Hugging Face's ByteLevel pre-tokenizer runs it (use_regex = true).
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3 (tiktoken cl100k): case-insensitive contractions, numbers in groups of up to three.
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: Llama 3's split with every digit on its own.
constexpr std::string_view kQwen2 = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
                                    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Every numeric character on its own (Hugging Face's Digits(individual_digits = true)).
constexpr std::string_view kEachDigit = R"(\p{N})";

constexpr std::array kGpt2Stages = {kGpt2};
// SmolLM / SmolLM2 (tokenizer.json: Sequence[Digits(individual_digits), ByteLevel]).
constexpr std::array kSmollmStages = {kEachDigit, kGpt2};
constexpr std::array kLlama3Stages = {kLlama3};
constexpr std::array kQwen2Stages = {kQwen2};

struct Entry {
  std::string_view name;
  std::span<const std::string_view> stages;
  // A piece that is a token of its own is taken whole, before any merging (Hugging Face's BPE
  // `ignore_merges`, which Llama 3's tokenizer.json sets; llama.cpp ties it to this pre-type).
  bool ignore_merges = false;
};

// To add a pre-tokenizer: its regexes above, one row here, and its splits in
// tests/fixtures/tokenizer/make_smollm2.py (PRE_TOKENIZERS) so the test checks them.
constexpr Entry kEntries[] = {
    {"gpt2", kGpt2Stages},
    {"smollm", kSmollmStages},
    {"llama3", kLlama3Stages, true},
    {"llama-bpe", kLlama3Stages, true},
    {"llama-v3", kLlama3Stages, true},
    {"qwen2", kQwen2Stages},
};

// The patterns above are written as Hugging Face writes them, for Oniguruma, where \s is the
// Unicode White_Space property. PCRE2's \s also takes U+180E (MONGOLIAN VOWEL SEPARATOR, a
// space before Unicode 6.3), so \s and \S are rewritten to White_Space spelled with general
// categories: \p{Z} (Zs, Zl, Zp) and the controls \t \n \v \f \r U+0085.
std::string with_white_space_property(std::string_view pattern) {
  constexpr std::string_view kWhiteSpace = R"(\p{Z}\t\n\x0B\f\r\x{85})";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S') {
        LLMK_CHECK(!in_class, "pre-tokenizer regex '{}': \\S inside a class", pattern);
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
    } else if (c == ']' && in_class) {
      in_class = false;
    }
    out += c;
  }
  return out;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  bool jit = false;

  explicit Regex(std::string_view source) {
    const std::string pattern = with_white_space_property(source);
    int error = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      LLMK_FAIL("pre-tokenizer regex '{}' does not compile at offset {}: {}", pattern, offset,
                reinterpret_cast<const char*>(message));
    }
    jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Cuts `text` into matches and the stretches between them.
  void split(std::string_view text, pcre2_match_data* md,
             std::vector<std::string_view>& out) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t last = 0;  // end of the previous match
    size_t pos = 0;
    while (pos < text.size()) {
      // The text was checked by the caller; none of the patterns can match the empty string.
      int rc = PCRE2_ERROR_JIT_STACKLIMIT;
      if (jit) rc = pcre2_jit_match(code, subject, text.size(), pos, 0, md, nullptr);
      // The interpreter keeps its backtracking state on the heap: the fallback for texts that
      // overflow the JIT's small stack (and for builds without JIT).
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof message);
        LLMK_FAIL("pre-tokenizer regex failed on a {}-byte text: {}", text.size(),
                  reinterpret_cast<const char*>(message));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t begin = ov[0], end = ov[1];
      LLMK_CHECK(end > begin, "pre-tokenizer regex matched the empty string");
      if (begin > last) out.push_back(text.substr(last, begin - last));
      out.push_back(text.substr(begin, end - begin));
      last = pos = end;
    }
    if (last < text.size()) out.push_back(text.substr(last));
  }
};

PreTokenizer PreTokenizer::create(std::string_view name) {
  for (const Entry& e : kEntries) {
    if (e.name != name) continue;
    PreTokenizer p;
    p.name_ = std::string(name);
    p.ignore_merges_ = e.ignore_merges;
    for (std::string_view pattern : e.stages) p.stages_.push_back(std::make_shared<Regex>(pattern));
    return p;
  }
  std::string names;
  for (std::string_view n : supported_names())
    names += (names.empty() ? "" : ", ") + std::string(n);
  LLMK_FAIL("unsupported pre-tokenizer '{}' (tokenizer.ggml.pre); supported: {}", printable(name),
            names);
}

std::vector<std::string_view> PreTokenizer::supported_names() {
  std::vector<std::string_view> names;
  for (const Entry& e : kEntries) names.push_back(e.name);
  return names;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  if (text.empty()) return;
  const size_t first = pieces.size();
  pieces.push_back(text);
  std::vector<std::string_view> stage_out;
  for (const auto& regex : stages_) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex->code, nullptr);
    LLMK_CHECK(md != nullptr, "out of memory for PCRE2 match data");
    stage_out.clear();
    try {
      for (size_t i = first; i < pieces.size(); ++i) regex->split(pieces[i], md, stage_out);
    } catch (...) {
      pcre2_match_data_free(md);
      throw;
    }
    pcre2_match_data_free(md);
    pieces.resize(first);
    pieces.insert(pieces.end(), stage_out.begin(), stage_out.end());
  }
}

}  // namespace llmk
