#include "engine/kv_pages.h"

#include <algorithm>

#include "core/error.h"

namespace llmk {

namespace {
uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

KvPages::KvPages(int64_t num_pages, int64_t page_size) : page_size_(page_size) {
  LLMK_CHECK(num_pages >= 1 && num_pages <= INT32_MAX && page_size >= 1,
             "KvPages: {} pages of {} tokens: need at least one page of at least one token",
             num_pages, page_size);
  pages_.resize(static_cast<size_t>(num_pages));
  free_.reserve(static_cast<size_t>(num_pages));
  // Taken from the back: page 0 first.
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

int64_t KvPages::available() const { return static_cast<int64_t>(free_.size() + cached_.size()); }

uint64_t KvPages::key_of(uint64_t parent, std::span<const int32_t> page_tokens) const {
  uint64_t h = mix(parent ^ 0x6c6c6d6b6b765067ull);
  for (const int32_t t : page_tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h | 1;  // never 0, the first page's parent
}

int32_t KvPages::lookup(uint64_t parent, std::span<const int32_t> tokens) const {
  const auto it = by_key_.find(key_of(parent, tokens));
  if (it == by_key_.end()) return -1;
  const Page& p = pages_[static_cast<size_t>(it->second)];
  const bool same = p.parent == parent &&
                    std::equal(tokens.begin(), tokens.end(), p.tokens.begin(), p.tokens.end());
  return same ? it->second : -1;
}

int32_t KvPages::take() {
  if (!free_.empty()) {
    const int32_t p = free_.back();
    free_.pop_back();
    return p;
  }
  if (cached_.empty()) return -1;
  const int32_t p = cached_.front();
  cached_.pop_front();
  Page& page = pages_[static_cast<size_t>(p)];
  by_key_.erase(page.key);
  page.keyed = false;
  page.tokens.clear();
  ++evictions_;
  return p;
}

void KvPages::hold(int32_t page) {
  Page& p = pages_[static_cast<size_t>(page)];
  if (p.refs == 0 && p.keyed) cached_.erase(p.lru);
  ++p.refs;
}

void KvPages::release(int32_t page) {
  Page& p = pages_[static_cast<size_t>(page)];
  LLMK_CHECK(p.refs > 0, "KvPages: page {} released more often than held", page);
  if (--p.refs > 0) return;
  if (p.keyed) {
    p.lru = cached_.insert(cached_.end(), page);
  } else {
    free_.push_back(page);
  }
}

KvPages::Seq& KvPages::seq(SeqId id) {
  const auto it = seqs_.find(id);
  LLMK_CHECK(it != seqs_.end(), "KvPages: no sequence {}", id);
  return it->second;
}

const KvPages::Seq& KvPages::seq(SeqId id) const {
  const auto it = seqs_.find(id);
  LLMK_CHECK(it != seqs_.end(), "KvPages: no sequence {}", id);
  return it->second;
}

std::optional<int64_t> KvPages::add(SeqId id, std::span<const int32_t> prompt) {
  LLMK_CHECK(!contains(id), "KvPages: sequence {} exists already", id);
  LLMK_CHECK(!prompt.empty(), "KvPages: sequence {} has an empty prompt", id);
  const auto n = static_cast<int64_t>(prompt.size());
  // The longest cached run of full pages, leaving at least one token to compute.
  std::vector<int32_t> hits;
  std::vector<uint64_t> keys;
  uint64_t parent = 0;
  int64_t reclaimed = 0;  // hits now cached (held by none): they stop being available
  while (static_cast<int64_t>(hits.size() + 1) * page_size_ <= n - 1) {
    const auto page_tokens = prompt.subspan(hits.size() * static_cast<size_t>(page_size_),
                                            static_cast<size_t>(page_size_));
    const int32_t p = lookup(parent, page_tokens);
    if (p < 0) break;
    hits.push_back(p);
    parent = pages_[static_cast<size_t>(p)].key;
    keys.push_back(parent);
    reclaimed += pages_[static_cast<size_t>(p)].refs == 0 ? 1 : 0;
  }
  const int64_t fresh = pages_for(n) - static_cast<int64_t>(hits.size());
  if (fresh > available() - reclaimed) return std::nullopt;
  Seq s;
  for (const int32_t p : hits) hold(p);
  s.table = std::move(hits);
  for (int64_t i = 0; i < fresh; ++i) {
    const int32_t p = take();
    hold(p);
    s.table.push_back(p);
  }
  s.tokens.assign(prompt.begin(), prompt.end());
  s.keys = std::move(keys);
  s.computed = static_cast<int64_t>(s.keys.size()) * page_size_;
  prefix_hit_tokens_ += s.computed;
  const int64_t cached = s.computed;
  seqs_.emplace(id, std::move(s));
  return cached;
}

bool KvPages::can_append(SeqId id, int64_t tokens) const {
  const Seq& s = seq(id);
  const auto have = static_cast<int64_t>(s.tokens.size());
  int64_t need = pages_for(have + tokens) - static_cast<int64_t>(s.table.size());
  if (tokens > 0 && have % page_size_ != 0 && ref_count(s.table.back()) > 1) ++need;  // a copy
  return need <= available();
}

std::optional<std::vector<KvPages::CopyOp>> KvPages::append(SeqId id,
                                                            std::span<const int32_t> tokens) {
  if (!can_append(id, static_cast<int64_t>(tokens.size()))) return std::nullopt;
  Seq& s = seq(id);
  std::vector<CopyOp> copies;
  const auto have = static_cast<int64_t>(s.tokens.size());
  if (!tokens.empty() && have % page_size_ != 0 && ref_count(s.table.back()) > 1) {
    // The partial last page is shared (a fork): this sequence writes into its own copy.
    const int32_t src = s.table.back(), dst = take();
    hold(dst);
    release(src);
    s.table.back() = dst;
    copies.push_back({src, dst, have % page_size_});
    ++copies_;
  }
  const int64_t more =
      pages_for(have + static_cast<int64_t>(tokens.size())) - static_cast<int64_t>(s.table.size());
  for (int64_t i = 0; i < more; ++i) {
    const int32_t p = take();
    hold(p);
    s.table.push_back(p);
  }
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  return copies;
}

void KvPages::key_next_page(Seq& s) {
  const size_t i = s.keys.size();
  const uint64_t parent = i == 0 ? 0 : s.keys[i - 1];
  const auto page_tokens = std::span<const int32_t>(s.tokens).subspan(
      i * static_cast<size_t>(page_size_), static_cast<size_t>(page_size_));
  const uint64_t key = key_of(parent, page_tokens);
  s.keys.push_back(key);
  Page& p = pages_[static_cast<size_t>(s.table[i])];
  if (p.keyed || by_key_.count(key) != 0) return;  // a hit, a fork's, or equal to a keyed page
  p.keyed = true;
  p.key = key;
  p.parent = parent;
  p.tokens.assign(page_tokens.begin(), page_tokens.end());
  by_key_.emplace(key, s.table[i]);
}

void KvPages::computed(SeqId id, int64_t n) {
  Seq& s = seq(id);
  LLMK_CHECK(n >= s.computed && n <= static_cast<int64_t>(s.tokens.size()),
             "KvPages: sequence {}: {} tokens computed, but it had {} of {}", id, n, s.computed,
             s.tokens.size());
  s.computed = n;
  while (static_cast<int64_t>(s.keys.size() + 1) * page_size_ <= n) key_next_page(s);
}

void KvPages::fork(SeqId parent, SeqId child) {
  LLMK_CHECK(!contains(child), "KvPages: sequence {} exists already", child);
  Seq s = seq(parent);
  for (const int32_t p : s.table) hold(p);
  seqs_.emplace(child, std::move(s));
}

void KvPages::free(SeqId id) {
  Seq& s = seq(id);
  // Last page first: of a sequence's cached pages, its earliest (the most shared prefixes) are
  // the last to be evicted.
  for (auto it = s.table.rbegin(); it != s.table.rend(); ++it) release(*it);
  seqs_.erase(id);
}

int64_t KvPages::tokens(SeqId id) const { return static_cast<int64_t>(seq(id).tokens.size()); }

const std::vector<int32_t>& KvPages::page_table(SeqId id) const { return seq(id).table; }

KvPages::Stats KvPages::stats() const {
  Stats st;
  st.pages = num_pages();
  for (const Page& p : pages_) {
    st.in_use += p.refs > 0 ? 1 : 0;
    st.shared += p.refs > 1 ? 1 : 0;
  }
  st.cached = static_cast<int64_t>(cached_.size());
  st.free = static_cast<int64_t>(free_.size());
  st.prefix_hit_tokens = prefix_hit_tokens_;
  st.copies = copies_;
  st.evictions = evictions_;
  return st;
}

}  // namespace llmk
