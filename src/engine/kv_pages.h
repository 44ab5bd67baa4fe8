// The KV cache's pages for many sequences: which pool pages hold which sequence's keys, shared
// where sequences share a prefix. Host-side bookkeeping only: it never touches the pool itself;
// where a page must be copied before a write (copy on write), it says which.
//
// - A pool of `num_pages` pages of `page_size` tokens. A sequence holds the pages its tokens
//   fill, in order (its page table); page j holds its tokens j * page_size ...
// - Pages are reference-counted: fork() gives a new sequence the parent's pages (the n samples
//   of one prompt share its pages), and a write into a page another sequence also holds first
//   moves the writer to a copy of it (a CopyOp for the caller to run on the pool).
// - Prefix caching: every full page is keyed by a hash chain over the tokens up to and including
//   it (the page's tokens and its parent's key), so a new sequence whose leading full pages hold
//   the same tokens as any earlier sequence's takes those pages instead of recomputing them.
//   A page whose last holder ends stays cached (evictable) until the pool needs it; pages are
//   evicted least recently freed first. At least one token of every prompt is always left to
//   compute (the step needs its logits), so a prompt never takes its last page from the cache.
// - Out of pages, the caller (the scheduler) frees a sequence and recomputes it later.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace llmk {

class KvPages {
 public:
  using SeqId = int64_t;
  struct CopyOp {  // copy the first `rows` token rows of page src into page dst (every layer)
    int32_t src, dst;
    int64_t rows;
  };
  struct Stats {
    int64_t pages = 0;              // the pool
    int64_t in_use = 0;             // held by at least one sequence
    int64_t shared = 0;             // held by more than one
    int64_t cached = 0;             // held by none, kept for prefix hits (evictable)
    int64_t free = 0;               // never written or evicted: free + cached pages can be taken
    int64_t prefix_hit_tokens = 0;  // prompt tokens taken from cached pages, since creation
    int64_t copies = 0;             // copy-on-write copies, since creation
    int64_t evictions = 0;          // cached pages given to other tokens, since creation
  };

  KvPages(int64_t num_pages, int64_t page_size);

  int64_t page_size() const { return page_size_; }
  int64_t num_pages() const { return static_cast<int64_t>(pages_.size()); }
  // Pages that can be taken now: free ones and cached ones no sequence holds.
  int64_t available() const;
  // Pages a sequence of `tokens` tokens fills.
  int64_t pages_for(int64_t tokens) const { return (tokens + page_size_ - 1) / page_size_; }

  // Starts sequence `id` (not yet known) on `prompt`: takes the cached pages of its longest
  // cached prefix of full pages (leaving at least one token to compute), then free pages for the
  // rest of the prompt. Returns the prompt tokens already in the cache (a multiple of
  // page_size, those the caller need not compute), or nullopt, taking nothing, when the pool
  // has too few pages.
  std::optional<int64_t> add(SeqId id, std::span<const int32_t> prompt);

  // Makes room for `tokens` more tokens of sequence `id` (after those it holds): takes pages as
  // they fill, and first copies its last page where it is partial and shared. Returns the copies
  // to run before the tokens' keys are written, or nullopt, changing nothing, when the pool has
  // too few pages.
  std::optional<std::vector<CopyOp>> append(SeqId id, std::span<const int32_t> tokens);

  // The first `n` tokens of `id` now have their keys in the pool (n never decreases): its full
  // pages among them are keyed for prefix hits. Pages are keyed only once written, so a sequence
  // added in the same step as the one writing them does not read them before they exist.
  void computed(SeqId id, int64_t n);

  // Whether `tokens` more tokens of `id` fit now (append would succeed).
  bool can_append(SeqId id, int64_t tokens) const;

  // Starts sequence `child` holding every page of `parent` (its tokens so far).
  void fork(SeqId parent, SeqId child);

  // Ends sequence `id`: each page it held loses a holder; a full, keyed page no one holds any
  // more stays cached, any other page becomes free.
  void free(SeqId id);

  bool contains(SeqId id) const { return seqs_.count(id) != 0; }
  int64_t tokens(SeqId id) const;
  const std::vector<int32_t>& page_table(SeqId id) const;
  int32_t ref_count(int32_t page) const { return pages_[static_cast<size_t>(page)].refs; }
  Stats stats() const;

 private:
  struct Page {
    int32_t refs = 0;
    bool keyed = false;                // full, written, and in by_key_
    uint64_t key = 0, parent = 0;      // its chain key and its predecessor's (0: first page)
    std::vector<int32_t> tokens;       // when keyed: checked on a hit (a hash is not proof)
    std::list<int32_t>::iterator lru;  // in cached_ when refs == 0 and keyed
  };
  struct Seq {
    std::vector<int32_t> table;
    std::vector<int32_t> tokens;  // every token it holds
    std::vector<uint64_t> keys;   // the chain key of each full, computed page
    int64_t computed = 0;
  };

  uint64_t key_of(uint64_t parent, std::span<const int32_t> page_tokens) const;
  // A page to write: a free one, else the least recently cached one (evicted). -1 when none.
  int32_t take();
  void hold(int32_t page);
  void release(int32_t page);
  // The keyed page holding `tokens` after the page keyed `parent`, or -1.
  int32_t lookup(uint64_t parent, std::span<const int32_t> tokens) const;
  // Keys the next full page of `s` (index s.keys.size()) for prefix hits, unless an equal page
  // is keyed already.
  void key_next_page(Seq& s);
  Seq& seq(SeqId id);
  const Seq& seq(SeqId id) const;

  int64_t page_size_;
  std::vector<Page> pages_;
  std::vector<int32_t> free_;  // never written or evicted, taken from the back
  std::list<int32_t> cached_;  // keyed, held by none: least recently freed first
  std::unordered_map<uint64_t, int32_t> by_key_;
  std::unordered_map<SeqId, Seq> seqs_;
  int64_t prefix_hit_tokens_ = 0, copies_ = 0, evictions_ = 0;
};

}  // namespace llmk
