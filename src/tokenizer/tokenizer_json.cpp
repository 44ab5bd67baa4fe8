// Tokenizer::from_hf_json: fills a TokenizerData from a Hugging Face tokenizer.json (and the
// tokenizer_config.json beside it) for the two kinds of BPE the supported families ship:
//  - byte-level BPE (Llama 3, Qwen2, SmolLM2): the pre-tokenizer is not interpreted; its JSON is
//    reduced to a signature and looked up in a table of the shapes that match an entry of
//    PreTokenizer's table. Normalizer: none or NFC (Qwen2).
//  - BPE with byte_fallback, as transformers' LlamaConverter and GemmaConverter write
//    SentencePiece models (Llama 2, Phi-3, Gemma): normalizer Replace(" ", "▁"), with
//    Prepend("▁") before it for Llama 2 / Phi-3; no pre-tokenizer (Gemma's Split on " " finds no
//    space left after the normalizer), or instead of that normalizer a Metaspace pre-tokenizer
//    without splitting (transformers 5's LlamaTokenizer); decoder Replace("▁", " "), ByteFallback,
//    Fuse, and Strip(" ", 1, 0) where Prepend added a space.
#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/text.h"
#include "formats/hf_config.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/spm_model.h"
#include "tokenizer/tokenizer.h"

namespace llmk {
namespace {

// Sorted objects: a vocabulary of 262k keys parses in seconds (file order is not needed).
using Json = nlohmann::json;

// The Split regexes of the table's entries, as tokenizer.json spells them (PreTokenizer keeps
// its own copies; tokenizer_json_test checks that both give the same ids).
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Signature of a pre-tokenizer (see signature_of) -> PreTokenizer table entry.
struct PreShape {
  std::string signature;
  std::string_view name;
};

std::vector<PreShape> known_pre_shapes() {
  const std::string split = "Split(isolated, ";
  return {
      {"ByteLevel(regex)", "gpt2"},
      {"Digits(individual) + ByteLevel(regex)", "smollm"},
      {split + std::string(kLlama3Regex) + ") + ByteLevel(no regex)", "llama3"},
      {split + std::string(kQwen2Regex) + ") + ByteLevel(no regex)", "qwen2"},
  };
}

// Reads one tokenizer.json; every error names the file and the JSON key.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  const std::string& path() const { return path_; }

  [[noreturn]] void fail(std::string_view key, std::string_view message) const {
    LLMK_FAIL("{}: {}: {}", path_, key, message);
  }

  // The member `name` of object `obj` (itself at `key`); nullptr when absent or null.
  const Json* find(const Json& obj, std::string_view key, std::string_view name) const {
    if (!obj.is_object())
      fail(key, fmt::format("is {}, expected an object", json_io::describe(obj)));
    const auto it = obj.find(std::string(name));
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
  }
  const Json& get(const Json& obj, std::string_view key, std::string_view name) const {
    const Json* v = find(obj, key, name);
    if (v == nullptr) fail(join(key, name), "missing");
    return *v;
  }
  std::string get_string(const Json& obj, std::string_view key, std::string_view name) const {
    return as_string(get(obj, key, name), join(key, name));
  }
  std::optional<std::string> find_string(const Json& obj, std::string_view key,
                                         std::string_view name) const {
    const Json* v = find(obj, key, name);
    if (v == nullptr) return std::nullopt;
    return as_string(*v, join(key, name));
  }
  bool get_bool(const Json& obj, std::string_view key, std::string_view name, bool fallback) const {
    const Json* v = find(obj, key, name);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) expected(*v, join(key, name), "a boolean");
    return v->get<bool>();
  }
  std::string as_string(const Json& v, std::string_view key) const {
    if (!v.is_string()) expected(v, key, "a string");
    return v.get<std::string>();
  }
  int32_t as_id(const Json& v, std::string_view key) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= INT32_MAX) {
      expected(v, key, "a token id (a non-negative integer)");
    }
    return static_cast<int32_t>(v.get<int64_t>());
  }
  [[noreturn]] void expected(const Json& v, std::string_view key, std::string_view what) const {
    fail(key, fmt::format("is {}, expected {}", json_io::describe(v), what));
  }

  static std::string join(std::string_view key, std::string_view name) {
    return key.empty() ? std::string(name) : fmt::format("{}.{}", key, name);
  }
  static std::string index(std::string_view key, size_t i) { return fmt::format("{}[{}]", key, i); }

  // Sequences inside Sequences (normalizers, pre-tokenizers): real files nest one level; the
  // bound keeps a deep nest from recursing (and building ever longer keys) without end.
  static constexpr int kMaxDepth = 8;
  // `depth`: 1 for the top-level value at `key`, one more for each Sequence around it.
  void check_depth(std::string_view key, int depth) const {
    if (depth > kMaxDepth) {
      fail(key, fmt::format("Sequence nested more than {} deep is not supported", kMaxDepth));
    }
  }

 private:
  std::string path_;
};

// The pre-tokenizer at `key`, reduced to a signature: the parts that change how text is cut,
// with the parts that cannot be honoured rejected.
std::string signature_of(const Reader& r, const Json& pre, const std::string& key, int depth) {
  r.check_depth(key, depth);
  const std::string type = r.get_string(pre, key, "type");
  if (type == "Sequence") {
    const Json& list = r.get(pre, key, "pretokenizers");
    if (!list.is_array() || list.empty())
      r.expected(list, key + ".pretokenizers", "a non-empty array");
    std::string out;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!out.empty()) out += " + ";
      out += signature_of(r, list[i], Reader::index(key + ".pretokenizers", i), depth + 1);
    }
    return out;
  }
  if (type == "ByteLevel") {
    if (r.get_bool(pre, key, "add_prefix_space", false)) {
      r.fail(key + ".add_prefix_space", "true is not supported");
    }
    return r.get_bool(pre, key, "use_regex", true) ? "ByteLevel(regex)" : "ByteLevel(no regex)";
  }
  if (type == "Digits") {
    if (!r.get_bool(pre, key, "individual_digits", false)) {
      r.fail(key + ".individual_digits", "false is not supported");
    }
    return "Digits(individual)";
  }
  if (type == "Split") {
    const Json& pattern = r.get(pre, key, "pattern");
    const std::optional<std::string> regex = r.find_string(pattern, key + ".pattern", "Regex");
    if (!regex) r.fail(key + ".pattern", "only a {\"Regex\": ...} pattern is supported");
    const std::string behavior = r.get_string(pre, key, "behavior");
    if (behavior != "Isolated") {
      r.fail(key + ".behavior",
             fmt::format("'{}' is not supported (only Isolated)", printable(behavior)));
    }
    if (r.get_bool(pre, key, "invert", false)) r.fail(key + ".invert", "true is not supported");
    return fmt::format("Split(isolated, {})", *regex);
  }
  r.fail(key + ".type", fmt::format("unsupported pre-tokenizer type '{}'", printable(type)));
}

// The PreTokenizer table entry for the file's "pre_tokenizer".
std::string_view pre_tokenizer_name(const Reader& r, const Json& root) {
  const Json* pre = r.find(root, "", "pre_tokenizer");
  if (pre == nullptr) r.fail("pre_tokenizer", "null is not supported (no byte-level split)");
  const std::string signature = signature_of(r, *pre, "pre_tokenizer", 1);
  std::string supported;
  for (const PreShape& shape : known_pre_shapes()) {
    if (shape.signature == signature) return shape.name;
    supported += fmt::format("{}{}", supported.empty() ? "" : ", ", shape.name);
  }
  r.fail("pre_tokenizer", fmt::format("unsupported pre-tokenizer {} (llmk supports the shapes of: "
                                      "{})",
                                      printable(signature), supported));
}

// One normalizer (a Sequence is flattened) into `n`.
void read_normalizer(const Reader& r, const Json& v, const std::string& key, int depth,
                     Normalizer& n) {
  r.check_depth(key, depth);
  const std::string type = r.get_string(v, key, "type");
  const auto set_once = [&](bool& flag) {
    if (flag) r.fail(key, fmt::format("{} appears twice", type));
    flag = true;
  };
  if (type == "Sequence") {
    const Json& list = r.get(v, key, "normalizers");
    if (!list.is_array()) r.expected(list, key + ".normalizers", "an array");
    for (size_t i = 0; i < list.size(); ++i) {
      read_normalizer(r, list[i], Reader::index(key + ".normalizers", i), depth + 1, n);
    }
  } else if (type == "NFC") {
    set_once(n.nfc);
  } else if (type == "Prepend") {
    const std::string prepend = r.get_string(v, key, "prepend");
    if (prepend != kSpaceMark) {
      r.fail(key + ".prepend",
             fmt::format("'{}' is not supported (only \"\u2581\")", printable(prepend)));
    }
    set_once(n.prepend_space);
  } else if (type == "Replace") {
    const std::optional<std::string> pattern =
        r.find_string(r.get(v, key, "pattern"), key + ".pattern", "String");
    const std::string content = r.get_string(v, key, "content");
    if (pattern != " " || content != kSpaceMark) {
      r.fail(key, "only Replace(\" \", \"\u2581\") is supported (a String pattern)");
    }
    set_once(n.escape_spaces);
  } else {
    r.fail(key + ".type", fmt::format("unsupported normalizer '{}' (supported: NFC, Prepend, "
                                      "Replace, Sequence of them)",
                                      printable(type)));
  }
}

Normalizer normalizer_of(const Reader& r, const Json& root) {
  Normalizer n;
  if (const Json* v = r.find(root, "", "normalizer")) read_normalizer(r, *v, "normalizer", 1, n);
  return n;
}

// The decoder of a BPE with byte fallback; returns whether it strips the leading space.
bool check_fallback_decoder(const Reader& r, const Json& root) {
  const Json& decoder = r.get(root, "", "decoder");
  const std::string type = r.get_string(decoder, "decoder", "type");
  if (type != "Sequence") {
    r.fail("decoder.type", fmt::format("unsupported decoder '{}' for byte_fallback (expected a "
                                       "Sequence of Replace, ByteFallback, Fuse[, Strip])",
                                       printable(type)));
  }
  const Json& list = r.get(decoder, "decoder", "decoders");
  if (!list.is_array()) r.expected(list, "decoder.decoders", "an array");
  const std::vector<std::string> expected = {"Replace", "ByteFallback", "Fuse", "Strip"};
  if (list.size() < 3 || list.size() > 4) {
    r.fail("decoder.decoders", "expected Replace, ByteFallback, Fuse and an optional Strip");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string key = Reader::index("decoder.decoders", i);
    const std::string t = r.get_string(list[i], key, "type");
    if (t != expected[i]) {
      r.fail(key + ".type",
             fmt::format("'{}' is not supported here (expected {})", printable(t), expected[i]));
    }
  }
  const Json& replace = list[0];
  const std::optional<std::string> pattern = r.find_string(
      r.get(replace, "decoder.decoders[0]", "pattern"), "decoder.decoders[0].pattern", "String");
  if (pattern != kSpaceMark || r.get_string(replace, "decoder.decoders[0]", "content") != " ") {
    r.fail("decoder.decoders[0]", "only Replace(\"\u2581\", \" \") is supported");
  }
  if (list.size() < 4) return false;
  const Json& strip = list[3];
  const Json* start = r.find(strip, "decoder.decoders[3]", "start");
  const Json* stop = r.find(strip, "decoder.decoders[3]", "stop");
  if (r.get_string(strip, "decoder.decoders[3]", "content") != " " || start == nullptr ||
      *start != 1 || stop == nullptr || *stop != 0) {
    r.fail("decoder.decoders[3]", "only Strip(\" \", 1, 0) is supported");
  }
  return true;
}

// The pre-tokenizer of a BPE with byte fallback: none; a Split on " " (Gemma's), which finds
// nothing once the normalizer has replaced every space; or Metaspace without splitting (what
// transformers 5's LlamaTokenizer writes).
TokenizerData::Metaspace fallback_pre_tokenizer(const Reader& r, const Json& root,
                                                const Normalizer& n) {
  using Metaspace = TokenizerData::Metaspace;
  const Json* pre = r.find(root, "", "pre_tokenizer");
  if (pre == nullptr) return Metaspace::None;
  const std::string type = r.get_string(*pre, "pre_tokenizer", "type");
  if (type == "Split" && n.escape_spaces) {
    const std::optional<std::string> pattern =
        r.find_string(r.get(*pre, "pre_tokenizer", "pattern"), "pre_tokenizer.pattern", "String");
    if (pattern == " " && !r.get_bool(*pre, "pre_tokenizer", "invert", false)) {
      return Metaspace::None;
    }
  }
  if (type == "Metaspace") {
    if (r.get_string(*pre, "pre_tokenizer", "replacement") != kSpaceMark) {
      r.fail("pre_tokenizer.replacement", "only \"\u2581\" is supported");
    }
    // Files from before prepend_scheme and split existed meant split = true.
    if (r.get_bool(*pre, "pre_tokenizer", "split", true)) {
      r.fail("pre_tokenizer.split", "true (or missing) is not supported");
    }
    const std::optional<std::string> scheme =
        r.find_string(*pre, "pre_tokenizer", "prepend_scheme");
    if (!scheme) {
      return r.get_bool(*pre, "pre_tokenizer", "add_prefix_space", true) ? Metaspace::Always
                                                                         : Metaspace::Never;
    }
    if (*scheme == "first") return Metaspace::First;
    if (*scheme == "always") return Metaspace::Always;
    if (*scheme == "never") return Metaspace::Never;
    r.fail("pre_tokenizer.prepend_scheme",
           fmt::format("unknown value '{}' (first, always, never)", printable(*scheme)));
  }
  r.fail("pre_tokenizer", fmt::format("unsupported pre-tokenizer '{}' with byte_fallback (llmk "
                                      "supports none, Metaspace without split, or a Split on "
                                      "\" \" after the normalizer replaced spaces)",
                                      printable(type)));
}

void check_byte_level_decoder(const Reader& r, const Json& root) {
  const std::string type = r.get_string(r.get(root, "", "decoder"), "decoder", "type");
  if (type != "ByteLevel") {
    r.fail("decoder.type",
           fmt::format("unsupported decoder '{}' (only ByteLevel)", printable(type)));
  }
}

struct BpeOptions {
  bool ignore_merges = false;
  bool byte_fallback = false;
};

// model: checks that it is a plain BPE; returns its options.
BpeOptions check_bpe_options(const Reader& r, const Json& model) {
  // Old files leave the type out; tokenizers then takes a model with merges for BPE.
  const std::optional<std::string> type = r.find_string(model, "model", "type");
  if (type ? *type != "BPE" : r.find(model, "model", "merges") == nullptr) {
    r.fail("model.type", fmt::format("unsupported model type '{}' (only BPE)",
                                     printable(type.value_or("<none>"))));
  }
  if (r.find(model, "model", "dropout") != nullptr) r.fail("model.dropout", "must be null");
  for (std::string_view affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const std::optional<std::string> s = r.find_string(model, "model", affix);
    if (s && !s->empty()) r.fail(Reader::join("model", affix), "must be empty");
  }
  r.get_bool(model, "model", "fuse_unk", false);  // type check only: every byte has a token
  return {r.get_bool(model, "model", "ignore_merges", false),
          r.get_bool(model, "model", "byte_fallback", false)};
}

// Fills d.tokens and d.token_types from model.vocab and added_tokens.
void read_vocabulary(const Reader& r, const Json& root, const Json& model, bool byte_fallback,
                     TokenizerData& d) {
  const Json& vocab = r.get(model, "model", "vocab");
  if (!vocab.is_object()) r.expected(vocab, "model.vocab", "an object (token -> id)");
  const Json* added = r.find(root, "", "added_tokens");
  if (added != nullptr && !added->is_array()) r.expected(*added, "added_tokens", "an array");
  // Ids index the vocabulary: one at or past the number of entries leaves some id without a
  // token, so it is refused before anything is sized by it.
  const size_t entries = vocab.size() + (added != nullptr ? added->size() : 0);
  const auto id_of = [&](const Json& v, const std::string& key) {
    const int32_t id = r.as_id(v, key);
    if (static_cast<size_t>(id) >= entries) {
      r.fail(key, fmt::format("id {} is out of range: the file has {} entries (model.vocab and "
                              "added_tokens), so ids must be below {}",
                              id, entries, entries));
    }
    return id;
  };
  std::vector<std::optional<std::string>> tokens;
  std::vector<int32_t> types;
  const auto place = [&](int32_t id, const std::string& text, TokenType type,
                         const std::string& key) {
    if (static_cast<size_t>(id) >= tokens.size()) {
      tokens.resize(static_cast<size_t>(id) + 1);
      types.resize(static_cast<size_t>(id) + 1, static_cast<int32_t>(TokenType::Normal));
    }
    if (tokens[id] && *tokens[id] != text) {
      r.fail(key, fmt::format("id {} is already '{}'", id, printable(*tokens[id])));
    }
    tokens[id] = text;
    types[id] = static_cast<int32_t>(type);
  };
  std::array<bool, 256> have_byte{};
  for (const auto& [text, id] : vocab.items()) {
    const std::string key = fmt::format("model.vocab['{}']", printable(text));
    const int byte = byte_fallback ? SpmModel::byte_token_value(text) : -1;
    place(id_of(id, key), text, byte >= 0 ? TokenType::Byte : TokenType::Normal, key);
    if (byte >= 0) have_byte[byte] = true;
  }
  for (int b = 0; b < 256 && byte_fallback; ++b) {
    if (!have_byte[b]) {
      r.fail("model.vocab", fmt::format("model.byte_fallback is true but there is no byte token "
                                        "'<0x{:02X}>' (all 256 are needed)",
                                        b));
    }
  }
  if (added != nullptr) {
    for (size_t i = 0; i < added->size(); ++i) {
      const Json& t = (*added)[i];
      const std::string key = Reader::index("added_tokens", i);
      if (r.get_bool(t, key, "single_word", false)) {
        r.fail(Reader::join(key, "single_word"), "true is not supported");
      }
      const bool special = r.get_bool(t, key, "special", false);
      const int32_t id = id_of(r.get(t, key, "id"), Reader::join(key, "id"));
      place(id, r.get_string(t, key, "content"),
            special ? TokenType::Control : TokenType::UserDefined, key);
      // tokenizers' default for an AddedToken: normalized unless special.
      d.added_tokens.push_back({id, r.get_bool(t, key, "normalized", !special),
                                r.get_bool(t, key, "lstrip", false),
                                r.get_bool(t, key, "rstrip", false)});
    }
  }
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (!tokens[id])
      r.fail("model.vocab",
             fmt::format("no token has id {} (ids must be 0..{})", id, tokens.size() - 1));
    d.tokens.push_back(std::move(*tokens[id]));
  }
  d.token_types = std::move(types);
}

// model.merges: "left right" strings or [left, right] pairs, as "left right".
void read_merges(const Reader& r, const Json& model, TokenizerData& d) {
  const Json& merges = r.get(model, "model", "merges");
  if (!merges.is_array()) r.expected(merges, "model.merges", "an array");
  d.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const Json& m = merges[i];
    const std::string key = Reader::index("model.merges", i);
    if (m.is_string()) {
      d.merges.push_back(r.as_string(m, key));
      continue;
    }
    if (!m.is_array() || m.size() != 2 || !m[0].is_string() || !m[1].is_string()) {
      r.expected(m, key, "a \"left right\" string or a [left, right] pair of strings");
    }
    const std::string left = r.as_string(m[0], Reader::index(key, 0));
    const std::string right = r.as_string(m[1], Reader::index(key, 1));
    // from_data splits "left right" at the space: byte-level tokens never hold one.
    if (left.empty() || right.empty() || left.find(' ') != std::string::npos ||
        right.find(' ') != std::string::npos) {
      r.fail(key, "a token of the pair is empty or holds a space");
    }
    d.merges.push_back(left + " " + right);
  }
}

// Whether post_processor's single-sequence template begins with the token `bos` (Llama 3 adds
// its bos this way instead of with add_bos_token). The post_processor itself and each of its
// "processors" (a Sequence) are looked at; only TemplateProcessing ones count.
bool post_processor_adds(const Reader& r, const Json& root, const std::string& bos) {
  const Json* processor = r.find(root, "", "post_processor");
  if (processor == nullptr) return false;
  std::vector<std::pair<const Json*, std::string>> candidates = {{processor, "post_processor"}};
  if (const Json* list = r.find(*processor, "post_processor", "processors")) {
    if (!list->is_array()) r.expected(*list, "post_processor.processors", "an array");
    for (size_t i = 0; i < list->size(); ++i) {
      candidates.emplace_back(&(*list)[i], Reader::index("post_processor.processors", i));
    }
  }
  for (const auto& [p, key] : candidates) {
    if (r.find_string(*p, key, "type") != "TemplateProcessing") continue;
    const Json* single = r.find(*p, key, "single");
    if (single == nullptr) continue;
    if (!single->is_array()) r.expected(*single, key + ".single", "an array");
    if (single->empty()) continue;
    const std::string first = Reader::index(key + ".single", 0);
    const Json* special = r.find((*single)[0], first, "SpecialToken");
    if (special != nullptr && r.get_string(*special, first + ".SpecialToken", "id") == bos) {
      return true;
    }
  }
  return false;
}

// tokenizer_config.json: bos/eos/pad/unk tokens, add_bos_token and the chat template.
void read_config(const Reader& file, const Json& root, const Json& model, TokenizerData& d) {
  const std::string dir = std::filesystem::path(file.path()).parent_path().string();
  const std::string path = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  const std::string jinja_path = (std::filesystem::path(dir) / "chat_template.jinja").string();
  std::unordered_map<std::string_view, int32_t> by_text;
  for (size_t i = d.tokens.size(); i-- > 0;) by_text[d.tokens[i]] = static_cast<int32_t>(i);

  if (const std::optional<std::string> unk = file.find_string(model, "model", "unk_token")) {
    const auto it = by_text.find(*unk);
    if (it != by_text.end()) d.unk_id = it->second;
  }
  std::optional<bool> add_bos;
  if (std::filesystem::exists(path)) {
    const Reader r(path);
    const Json config = json_io::parse(json_io::read_file(path), path);
    if (!config.is_object()) r.expected(config, "(top level)", "an object");
    // A token is its text or an AddedToken object {"content": ...}.
    const auto token_id = [&](std::string_view key) -> std::optional<int32_t> {
      const Json* v = r.find(config, "", key);
      if (v == nullptr) return std::nullopt;
      const std::string text =
          v->is_object() ? r.get_string(*v, key, "content") : r.as_string(*v, key);
      const auto it = by_text.find(text);
      if (it == by_text.end()) {
        r.fail(key, fmt::format("token '{}' is not in the vocabulary", printable(text)));
      }
      return it->second;
    };
    if (auto id = token_id("bos_token")) d.bos_id = *id;
    if (auto id = token_id("eos_token")) d.eos_id = *id;
    if (auto id = token_id("pad_token")) d.pad_id = *id;
    if (auto id = token_id("unk_token")) d.unk_id = *id;
    if (r.find(config, "", "add_bos_token") != nullptr) {
      add_bos = r.get_bool(config, "", "add_bos_token", false);
    }
    if (const Json* t = r.find(config, "", "chat_template")) {
      if (t->is_string()) {
        d.chat_template = r.as_string(*t, "chat_template");
      } else if (t->is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (size_t i = 0; i < t->size(); ++i) {
          const std::string key = Reader::index("chat_template", i);
          if (r.get_string((*t)[i], key, "name") == "default") {
            d.chat_template = r.get_string((*t)[i], key, "template");
          }
        }
      } else {
        r.expected(*t, "chat_template", "a string or an array of {name, template}");
      }
    }
  }
  if (d.chat_template.empty() && std::filesystem::exists(jinja_path)) {
    d.chat_template = json_io::read_file(jinja_path);
  }
  d.add_bos =
      add_bos.value_or(d.bos_id >= 0 && post_processor_adds(file, root, d.tokens[d.bos_id]));
}

std::string tokenizer_json_path(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return (std::filesystem::path(path) / "tokenizer.json").string();
  }
  return path;
}

}  // namespace

Tokenizer Tokenizer::from_hf_json(const std::string& path) {
  const std::string file = tokenizer_json_path(path);
  const Reader r(file);
  const Json root = json_io::parse(json_io::read_file(file), file);
  if (!root.is_object()) r.expected(root, "(top level)", "an object");

  const Json& model = r.get(root, "", "model");
  const BpeOptions options = check_bpe_options(r, model);
  TokenizerData d;
  d.normalizer = normalizer_of(r, root);
  if (options.byte_fallback) {
    // SentencePiece-style: merges over characters, spaces written "▁" by the normalizer.
    d.model = "llama";
    d.use_merges = true;
    d.metaspace = fallback_pre_tokenizer(r, root, d.normalizer);
    if (!d.normalizer.escape_spaces && d.metaspace == TokenizerData::Metaspace::None) {
      r.fail("normalizer",
             "model.byte_fallback needs a Replace(\" \", \"\u2581\") normalizer "
             "or a Metaspace pre-tokenizer");
    }
    if (options.ignore_merges) r.fail("model.ignore_merges", "true is not supported here");
    d.strip_space = check_fallback_decoder(r, root);
  } else {
    if (d.normalizer.prepend_space || d.normalizer.escape_spaces) {
      r.fail("normalizer",
             "Prepend/Replace of spaces needs model.byte_fallback (byte-level BPE "
             "takes NFC only)");
    }
    check_byte_level_decoder(r, root);
    d.model = "gpt2";
    d.pre = std::string(pre_tokenizer_name(r, root));
    if (PreTokenizer::create(d.pre).ignore_merges() != options.ignore_merges) {
      r.fail("model.ignore_merges", fmt::format("{} is not supported with the '{}' pre-tokenizer",
                                                options.ignore_merges, d.pre));
    }
  }
  read_vocabulary(r, root, model, options.byte_fallback, d);
  read_merges(r, model, d);
  read_config(r, root, model, d);
  try {
    return from_data(std::move(d));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", file, e.what()));
  }
}

}  // namespace llmk
