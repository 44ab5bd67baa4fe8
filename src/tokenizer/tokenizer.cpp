#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <limits>
#include <unordered_map>

#include "core/error.h"
#include "core/text.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/spm_model.h"
#include "tokenizer/utf8.h"

namespace llmk {
namespace {

constexpr std::string_view kSpmModel = "llama";  // SentencePiece-style BPE (spm_model.h)
constexpr std::string_view kSupportedModels = "gpt2, llama";

// Texts of tokens that end a generated turn in the families llmk knows.
constexpr std::string_view kEndOfTurnTexts[] = {
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>",
};

// A token cut out of the text before pre-tokenization.
struct SpecialText {
  std::string_view text;
  int32_t id;
  bool control;         // matched only when parse_special; user-defined tokens always are
  bool normalized;      // matched in the normalized text (TokenizerData::AddedToken)
  bool lstrip, rstrip;  // takes the whitespace before / after it along
};

}  // namespace

struct Tokenizer::Impl {
  TokenizerData data;
  std::vector<TokenType> types;
  std::vector<std::string> bytes;                         // per token
  std::unordered_map<std::string_view, int32_t> by_text;  // views into data.tokens
  std::vector<SpecialText> specials;
  // How many specials each stage has: [normalized][control].
  size_t special_count[2][2] = {{0, 0}, {0, 0}};
  PreTokenizer pre;
  BpeModel bpe;
  std::optional<SpmModel> spm;  // set for "llama" without use_merges (then pre and bpe are unused)

  int32_t size() const { return static_cast<int32_t>(data.tokens.size()); }
  void check_id(int32_t id) const {
    LLMK_CHECK(id >= 0 && id < size(), "token id {} out of range for a vocabulary of {} tokens", id,
               size());
  }

  // Appends the ids of text that holds no special token; at_start: the text begins the input.
  void encode_plain(std::string_view text, bool at_start, std::vector<std::string_view>& pieces,
                    BpeModel::Scratch& scratch, std::vector<int32_t>& out) const;

  // Cuts the special tokens of one stage (those matched in the normalized text, or in the raw
  // text) out of `text`, leftmost-longest as Hugging Face's added vocabulary does: appends their
  // ids to `out` and hands each stretch between them (possibly empty) to `plain`.
  template <class Plain>
  void split_specials(std::string_view text, bool normalized, bool parse_special,
                      std::vector<int32_t>& out, Plain&& plain) const;
};

namespace {

std::vector<TokenType> check_types(const TokenizerData& d) {
  std::vector<TokenType> types(d.tokens.size(), TokenType::Normal);
  if (d.token_types.empty()) return types;
  LLMK_CHECK(d.token_types.size() == d.tokens.size(), "tokenizer has {} token types for {} tokens",
             d.token_types.size(), d.tokens.size());
  for (size_t i = 0; i < types.size(); ++i) {
    const int32_t t = d.token_types[i];
    LLMK_CHECK(t >= 1 && t <= 6, "token {} ('{}') has unknown token type {}", i,
               printable(d.tokens[i]), t);
    types[i] = static_cast<TokenType>(t);
  }
  return types;
}

void check_optional_id(int32_t id, std::string_view what, size_t vocab) {
  LLMK_CHECK(id >= -1 && id < static_cast<int64_t>(vocab),
             "{} token id {} out of range for a vocabulary of {} tokens", what, id, vocab);
}

// The bytes a token stands for. Control and user-defined tokens are written as plain text;
// other tokens are in the byte alphabet, except in files that store a few as plain text (a
// character outside the alphabet): those are taken as their text too.
std::string token_bytes_of(const std::string& text, TokenType type) {
  if (type == TokenType::Control || type == TokenType::UserDefined) return text;
  std::optional<std::string> b = byte_level::decode(text);
  return b ? std::move(*b) : text;
}

}  // namespace

Tokenizer Tokenizer::from_data(TokenizerData data) {
  LLMK_CHECK(data.model == "gpt2" || data.model == kSpmModel,
             "unsupported tokenizer model '{}' (tokenizer.ggml.model); supported: {}",
             printable(data.model), kSupportedModels);
  LLMK_CHECK(!data.tokens.empty(), "tokenizer has no tokens");
  LLMK_CHECK(data.tokens.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
             "tokenizer has too many tokens ({})", data.tokens.size());
  const size_t n = data.tokens.size();
  check_optional_id(data.bos_id, "bos", n);
  check_optional_id(data.eos_id, "eos", n);
  check_optional_id(data.unk_id, "unknown", n);
  check_optional_id(data.pad_id, "padding", n);

  const bool spm = data.model == kSpmModel;
  LLMK_CHECK(!data.use_merges || spm, "use_merges is for the '{}' model only", kSpmModel);
  LLMK_CHECK(data.use_merges || !(data.normalizer.prepend_space || data.normalizer.escape_spaces),
             "a normalizer that writes '\u2581' for spaces needs a BPE with byte fallback");
  LLMK_CHECK(data.use_merges || data.metaspace == TokenizerData::Metaspace::None,
             "the Metaspace pre-tokenizer needs a BPE with byte fallback");
  std::vector<TokenizerData::AddedToken> added(n);  // by id
  for (const TokenizerData::AddedToken& a : data.added_tokens) {
    LLMK_CHECK(a.id >= 0 && static_cast<size_t>(a.id) < n, "added token id {} out of range", a.id);
    added[a.id] = a;
  }

  auto impl = std::make_shared<Impl>();
  if (!spm) impl->pre = PreTokenizer::create(data.pre);
  impl->types = check_types(data);
  impl->data = std::move(data);
  const TokenizerData& d = impl->data;

  impl->bytes.reserve(n);
  impl->by_text.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    impl->bytes.push_back(spm ? SpmModel::token_bytes(d.tokens[i], impl->types[i])
                              : token_bytes_of(d.tokens[i], impl->types[i]));
    impl->by_text.emplace(d.tokens[i], id);  // the first of duplicate texts wins
    const TokenType t = impl->types[i];
    if ((t == TokenType::Control || t == TokenType::UserDefined) && !d.tokens[i].empty() &&
        !(spm && SpmModel::is_space_run(d.tokens[i], t))) {
      const TokenizerData::AddedToken& a = added[i];
      impl->specials.push_back(
          {d.tokens[i], id, t == TokenType::Control, a.normalized, a.lstrip, a.rstrip});
      ++impl->special_count[a.normalized][t == TokenType::Control];
    }
  }

  if (spm && !d.use_merges) {
    impl->spm.emplace(d.tokens, d.scores, impl->types, d.unk_id);
    return Tokenizer(std::move(impl));
  }

  // BPE works on ids: a text is a BPE symbol unless it is a control token, which BPE must
  // never produce.
  const auto symbol = [&](std::string_view text) -> int32_t {
    auto it = impl->by_text.find(text);
    if (it == impl->by_text.end() || impl->types[it->second] == TokenType::Control) return -1;
    return it->second;
  };
  std::array<int32_t, 256> byte_ids;
  byte_ids.fill(-1);
  std::unordered_map<uint32_t, int32_t> char_ids;  // use_merges: single-character tokens
  if (d.use_merges) {
    for (size_t i = n; i-- > 0;) {  // the first of duplicate texts wins
      const std::string& text = d.tokens[i];
      if (impl->types[i] == TokenType::Byte) {
        const std::string& b = impl->bytes[i];
        if (b.size() == 1) byte_ids[static_cast<uint8_t>(b[0])] = static_cast<int32_t>(i);
      } else if (impl->types[i] == TokenType::Normal && !text.empty() &&
                 utf8::sequence_length(text, 0) == text.size()) {
        char_ids[BpeModel::char_key(text)] = static_cast<int32_t>(i);
      }
    }
  } else {
    for (int b = 0; b < 256; ++b) byte_ids[b] = symbol(byte_level::spell(static_cast<uint8_t>(b)));
  }

  std::vector<BpeModel::Merge> merges;
  merges.reserve(d.merges.size());
  std::string joined;
  for (size_t i = 0; i < d.merges.size(); ++i) {
    const std::string& m = d.merges[i];
    // Tokens in the byte alphabet hold no space; search from 1 so that a first token " " of a
    // plain-text vocabulary still parses.
    const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    LLMK_CHECK(space != std::string::npos && space + 1 < m.size(),
               "merge {} ('{}') is not two tokens separated by a space", i, printable(m));
    const std::string_view left(m.data(), space), right(m.data() + space + 1, m.size() - space - 1);
    joined.assign(left);
    joined += right;
    for (std::string_view part : {left, right, std::string_view(joined)}) {
      LLMK_CHECK(impl->by_text.count(part), "merge {} ('{}'): token '{}' is not in the vocabulary",
                 i, printable(m), printable(part));
    }
    const int32_t l = symbol(left), r = symbol(right), result = symbol(joined);
    if (l < 0 || r < 0 || result < 0) continue;  // involves a control token
    merges.push_back({l, r, result});
  }
  impl->bpe =
      d.use_merges ? BpeModel(std::move(char_ids), byte_ids, merges) : BpeModel(byte_ids, merges);
  return Tokenizer(std::move(impl));
}

template <class Plain>
void Tokenizer::Impl::split_specials(std::string_view text, bool normalized, bool parse_special,
                                     std::vector<int32_t>& out, Plain&& plain) const {
  // next[k] caches where token k occurs next, recomputed once the scan passes it.
  constexpr size_t kUnknown = std::string_view::npos - 1;
  constexpr size_t kSkip = std::string_view::npos - 2;
  if (special_count[normalized][0] + (parse_special ? special_count[normalized][1] : 0) == 0) {
    plain(text);
    return;
  }
  std::vector<size_t> next(specials.size(), kUnknown);
  for (size_t k = 0; k < specials.size(); ++k) {
    const SpecialText& s = specials[k];
    if (s.normalized != normalized || (s.control && !parse_special)) next[k] = kSkip;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best_at = std::string_view::npos;
    const SpecialText* best = nullptr;
    for (size_t k = 0; k < specials.size(); ++k) {
      if (next[k] == kSkip) continue;
      const SpecialText& s = specials[k];
      if (next[k] == kUnknown || (next[k] != std::string_view::npos && next[k] < pos)) {
        next[k] = text.find(s.text, pos);
      }
      if (next[k] == std::string_view::npos) continue;
      if (next[k] < best_at || (next[k] == best_at && s.text.size() > best->text.size())) {
        best_at = next[k];
        best = &s;
      }
    }
    if (best == nullptr) break;
    size_t start = best_at, stop = best_at + best->text.size();
    if (best->lstrip) start -= unicode::whitespace_suffix(text.substr(pos, start - pos));
    if (best->rstrip) stop += unicode::whitespace_prefix(text.substr(stop));
    plain(text.substr(pos, start - pos));
    out.push_back(best->id);
    pos = stop;
  }
  if (pos < text.size()) plain(text.substr(pos));
}

void Tokenizer::Impl::encode_plain(std::string_view text, bool at_start,
                                   std::vector<std::string_view>& pieces,
                                   BpeModel::Scratch& scratch, std::vector<int32_t>& out) const {
  using Metaspace = TokenizerData::Metaspace;
  if (data.use_merges && (data.metaspace == Metaspace::None || text.empty())) {
    bpe.encode(text, scratch, out);  // no pre-tokenizer: the whole stretch is one piece
    return;
  }
  if (data.use_merges) {
    std::string escaped = Normalizer{.escape_spaces = true}.apply(text);
    const bool prepend =
        data.metaspace == Metaspace::Always || (data.metaspace == Metaspace::First && at_start);
    if (prepend && !escaped.starts_with(kSpaceMark)) escaped.insert(0, kSpaceMark);
    bpe.encode(escaped, scratch, out);
    return;
  }
  // The regexes need valid UTF-8: split off invalid bytes, each of which is its own piece.
  while (!text.empty()) {
    const size_t valid = utf8::valid_prefix(text);
    pieces.clear();
    pre.split(text.substr(0, valid), pieces);
    for (std::string_view p : pieces) {
      if (pre.ignore_merges()) {
        const auto it = by_text.find(byte_level::encode(p));
        if (it != by_text.end() && types[it->second] != TokenType::Control) {
          out.push_back(it->second);
          continue;
        }
      }
      bpe.encode(p, scratch, out);
    }
    if (valid < text.size()) bpe.encode(text.substr(valid, 1), scratch, out);
    text.remove_prefix(std::min(text.size(), valid + 1));
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos) {
    LLMK_CHECK(m.data.bos_id >= 0, "encode: add_bos requested but the vocabulary has no bos token");
    out.push_back(m.data.bos_id);
  }
  std::vector<std::string_view> pieces;
  BpeModel::Scratch scratch;
  SpmModel::Scratch spm_scratch;
  const auto encode_plain = [&](std::string_view plain, bool at_start) {
    if (m.spm) {
      m.spm->encode(plain, spm_scratch, out);
    } else {
      m.encode_plain(plain, at_start, pieces, scratch, out);
    }
  };

  // Added tokens matched in the raw text first; each stretch between them is normalized, and
  // the added tokens matched in the normalized text are cut out of it. A piece is at the start
  // of the text when it begins both its stretch and the text.
  const auto encode_stretch = [&](std::string_view stretch) {
    const bool first = stretch.data() == text.data();
    const auto split_normalized = [&](std::string_view normalized) {
      m.split_specials(normalized, true, parse_special, out, [&](std::string_view piece) {
        encode_plain(piece, first && piece.data() == normalized.data());
      });
    };
    if (m.data.normalizer.empty()) {
      split_normalized(stretch);
    } else {
      split_normalized(m.data.normalizer.apply(stretch));
    }
  };
  m.split_specials(text, false, parse_special, out, encode_stretch);
  // A text that starts with the bos token (a chat template writing "<bos>") keeps only that one.
  if (add_bos && out.size() > 1 && out[1] == m.data.bos_id) out.erase(out.begin());
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    impl_->check_id(id);
    if (skip_special && is_special(id)) continue;
    out += impl_->bytes[id];
  }
  if (impl_->data.strip_space && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  impl_->check_id(id);
  return impl_->bytes[id];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  impl_->check_id(id);
  return impl_->data.tokens[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  impl_->check_id(id);
  return impl_->types[id];
}

bool Tokenizer::is_special(int32_t id) const {
  const TokenType t = token_type(id);
  return t == TokenType::Control || t == TokenType::Unknown;
}

int32_t Tokenizer::vocab_size() const { return impl_->size(); }
int32_t Tokenizer::bos_id() const { return impl_->data.bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->data.eos_id; }
int32_t Tokenizer::unk_id() const { return impl_->data.unk_id; }
int32_t Tokenizer::pad_id() const { return impl_->data.pad_id; }
bool Tokenizer::add_bos() const { return impl_->data.add_bos; }
const std::string& Tokenizer::chat_template() const { return impl_->data.chat_template; }
const TokenizerData& Tokenizer::data() const { return impl_->data; }
const std::string& Tokenizer::pre_tokenizer() const {
  return impl_->spm ? impl_->data.pre : impl_->pre.name();
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  auto it = impl_->by_text.find(text);
  if (it == impl_->by_text.end()) return std::nullopt;
  return it->second;
}

std::vector<int32_t> Tokenizer::end_of_generation_ids() const {
  std::vector<int32_t> ids;
  if (eos_id() >= 0) ids.push_back(eos_id());
  for (std::string_view text : kEndOfTurnTexts) {
    const std::optional<int32_t> id = find_token(text);
    if (!id) continue;
    const TokenType t = impl_->types[*id];
    if (t != TokenType::Control && t != TokenType::UserDefined) continue;
    if (std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  }
  return ids;
}

}  // namespace llmk
