// KvPages: taking and freeing pages, prefix hits, forks and copy on write, eviction, and a
// random walk over all of them against a simulated pool: whatever the sharing, reading a
// sequence's rows through its page table must give back exactly its own tokens.
#include "engine/kv_pages.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"

namespace llmk {
namespace {

std::vector<int32_t> seq_of(int32_t first, int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(KvPages, TakesAndFreesPages) {
  KvPages kv(4, 4);
  EXPECT_EQ(kv.add(1, seq_of(0, 10)), 0);  // 3 pages
  EXPECT_EQ(kv.page_table(1).size(), 3u);
  auto st = kv.stats();
  EXPECT_EQ(st.in_use, 3);
  EXPECT_EQ(st.free, 1);
  EXPECT_EQ(kv.add(2, seq_of(100, 8)), std::nullopt);  // 2 pages, 1 left: nothing taken
  EXPECT_FALSE(kv.contains(2));
  EXPECT_EQ(kv.stats().free, 1);
  EXPECT_TRUE(kv.can_append(1, 6));  // 16 tokens: the 4th page
  EXPECT_FALSE(kv.can_append(1, 7));
  EXPECT_EQ(kv.append(1, seq_of(10, 7)), std::nullopt);
  EXPECT_EQ(kv.tokens(1), 10);
  ASSERT_TRUE(kv.append(1, seq_of(10, 6)));
  EXPECT_EQ(kv.stats().free, 0);
  kv.free(1);  // nothing computed: nothing keyed, every page free
  st = kv.stats();
  EXPECT_EQ(st.free, 4);
  EXPECT_EQ(st.cached, 0);
  EXPECT_EQ(st.in_use, 0);
}

TEST(KvPages, PrefixHitsTakeComputedFullPages) {
  KvPages kv(11, 4);
  const std::vector<int32_t> a = seq_of(0, 10);
  ASSERT_EQ(kv.add(1, a), 0);
  kv.computed(1, 10);  // pages 0 and 1 full: keyed
  const std::vector<int32_t> a_table = kv.page_table(1);
  kv.free(1);
  auto st = kv.stats();
  EXPECT_EQ(st.cached, 2);
  EXPECT_EQ(st.free, 9);

  std::vector<int32_t> b = seq_of(0, 8);  // the same 8 first tokens, then others
  for (int32_t t : {50, 51, 52, 53}) b.push_back(t);
  ASSERT_EQ(kv.add(2, b), 8);
  EXPECT_EQ(kv.page_table(2)[0], a_table[0]);
  EXPECT_EQ(kv.page_table(2)[1], a_table[1]);
  EXPECT_EQ(kv.stats().cached, 0);  // held again
  EXPECT_EQ(kv.stats().prefix_hit_tokens, 8);

  // A prompt of exactly the cached pages keeps its last token to compute: one page only.
  ASSERT_EQ(kv.add(3, seq_of(0, 8)), 4);
  EXPECT_EQ(kv.ref_count(a_table[0]), 2);
  // The second page's tokens after another first page: no hit (the key chains).
  std::vector<int32_t> c = {9, 9, 9, 9, 4, 5, 6, 7, 8};
  EXPECT_EQ(kv.add(4, c), 0);
  // A page not computed is not offered.
  ASSERT_EQ(kv.add(5, seq_of(200, 9)), 0);
  EXPECT_EQ(kv.add(6, seq_of(200, 9)), std::nullopt);  // 3 pages, 0 hits: too few left
  kv.free(5);
  EXPECT_EQ(kv.add(6, seq_of(200, 9)), 0);
}

TEST(KvPages, ForksShareAndCopyOnWrite) {
  KvPages kv(8, 4);
  ASSERT_EQ(kv.add(1, seq_of(0, 6)), 0);  // pages: full, partial (2 rows)
  kv.computed(1, 6);
  kv.fork(1, 2);
  kv.fork(1, 3);
  const int32_t full = kv.page_table(1)[0], part = kv.page_table(1)[1];
  EXPECT_EQ(kv.ref_count(full), 3);
  EXPECT_EQ(kv.ref_count(part), 3);
  EXPECT_EQ(kv.stats().shared, 2);

  auto ops = kv.append(2, std::vector<int32_t>{7});
  ASSERT_TRUE(ops);
  ASSERT_EQ(ops->size(), 1u);
  EXPECT_EQ((*ops)[0].src, part);
  EXPECT_EQ((*ops)[0].rows, 2);
  EXPECT_NE(kv.page_table(2)[1], part);
  EXPECT_EQ((*ops)[0].dst, kv.page_table(2)[1]);
  EXPECT_EQ(kv.page_table(2)[0], full);  // the full page stays shared
  EXPECT_EQ(kv.ref_count(part), 2);
  ops = kv.append(3, std::vector<int32_t>{8});
  ASSERT_TRUE(ops && ops->size() == 1u);
  EXPECT_EQ(kv.ref_count(part), 1);
  ops = kv.append(1, std::vector<int32_t>{9});  // the last holder writes in place
  ASSERT_TRUE(ops);
  EXPECT_TRUE(ops->empty());
  EXPECT_EQ(kv.page_table(1)[1], part);
  EXPECT_EQ(kv.stats().copies, 2);

  // A fork whose last page is full shares it and copies nothing: new tokens start a new page.
  ASSERT_TRUE(kv.append(1, std::vector<int32_t>{10}));  // 8 tokens: both pages full
  kv.fork(1, 4);
  ops = kv.append(4, std::vector<int32_t>{11});
  ASSERT_TRUE(ops);
  EXPECT_TRUE(ops->empty());
  EXPECT_EQ(kv.page_table(4).size(), 3u);
  EXPECT_EQ(kv.page_table(4)[1], part);
}

TEST(KvPages, EvictsTheLeastRecentlyFreedCachedPages) {
  KvPages kv(6, 2);
  ASSERT_EQ(kv.add(1, seq_of(0, 4)), 0);
  kv.computed(1, 4);
  ASSERT_EQ(kv.add(2, seq_of(10, 4)), 0);
  kv.computed(2, 4);
  kv.free(1);  // freed first, last page first: cached 1b, 1a, 2b, 2a
  kv.free(2);
  EXPECT_EQ(kv.stats().cached, 4);
  EXPECT_EQ(kv.available(), 6);
  ASSERT_EQ(kv.add(3, seq_of(100, 5)), 0);  // 3 pages: the 2 free ones, then 1b evicted
  EXPECT_EQ(kv.stats().evictions, 1);
  // 1a is still cached: a hit, and one more page (2b, evicted).
  ASSERT_EQ(kv.add(4, seq_of(0, 3)), 2);
  EXPECT_EQ(kv.stats().evictions, 2);
  // 2a would be a hit, but the one page it also needs is 2a itself: refused, nothing taken.
  EXPECT_EQ(kv.add(5, seq_of(10, 3)), std::nullopt);
  EXPECT_EQ(kv.stats().cached, 1);
  kv.free(3);
  EXPECT_EQ(kv.add(5, seq_of(10, 3)), 2);
  EXPECT_EQ(kv.stats().evictions, 2);
}

TEST(KvPages, BadUse) {
  EXPECT_THROW(KvPages(0, 4), Error);
  KvPages kv(2, 2);
  ASSERT_TRUE(kv.add(1, seq_of(0, 1)));
  EXPECT_THROW(kv.add(1, seq_of(0, 1)), Error);
  EXPECT_THROW(kv.add(2, std::vector<int32_t>{}), Error);
  EXPECT_THROW(kv.free(7), Error);
  EXPECT_THROW(kv.computed(1, 2), Error);
  EXPECT_THROW(kv.fork(1, 1), Error);
}

// A simulated pool: the token each row holds. Each step picks an operation at random over a
// vocabulary of 3 tokens, prompts starting with part of one of three fixed prefixes; "computing"
// writes a sequence's new tokens into its rows. After every step every sequence must read back
// exactly its tokens, and the pages must be accounted for exactly once.
TEST(KvPages, RandomWalkKeepsEverySequenceIntact) {
  for (int64_t page_size : {1, 3, 4}) {
    const int64_t num_pages = 24;
    KvPages kv(num_pages, page_size);
    std::vector<std::vector<int32_t>> pool(
        static_cast<size_t>(num_pages), std::vector<int32_t>(static_cast<size_t>(page_size), -1));
    std::map<KvPages::SeqId, std::vector<int32_t>> live;
    std::mt19937 rng(static_cast<uint32_t>(page_size));
    KvPages::SeqId next = 0;
    const auto row = [&](KvPages::SeqId id, int64_t i) -> int32_t& {
      const int32_t page = kv.page_table(id)[static_cast<size_t>(i / page_size)];
      return pool[static_cast<size_t>(page)][static_cast<size_t>(i % page_size)];
    };
    const auto write = [&](KvPages::SeqId id, int64_t from) {
      const std::vector<int32_t>& t = live[id];
      for (int64_t i = from; i < static_cast<int64_t>(t.size()); ++i) row(id, i) = t[i];
      kv.computed(id, static_cast<int64_t>(t.size()));
    };
    const auto random_tokens = [&](int n) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (int32_t& t : v) t = static_cast<int32_t>(rng() % 3);
      return v;
    };
    // Prompts: part of one of three fixed "system prompts", then 1-4 random tokens.
    const std::vector<std::vector<int32_t>> bank = {random_tokens(9), random_tokens(9),
                                                    random_tokens(9)};
    int hits = 0, copies = 0, refused = 0;
    for (int step = 0; step < 3000; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 3 || live.empty()) {  // a new sequence
        const std::vector<int32_t>& sys = bank[rng() % bank.size()];
        std::vector<int32_t> prompt(sys.begin(), sys.begin() + static_cast<long>(rng() % 10));
        const std::vector<int32_t> tail = random_tokens(1 + static_cast<int>(rng() % 4));
        prompt.insert(prompt.end(), tail.begin(), tail.end());
        const auto cached = kv.add(next, prompt);
        if (!cached) {
          ++refused;
          continue;
        }
        live[next] = prompt;
        for (int64_t i = 0; i < *cached; ++i) ASSERT_EQ(row(next, i), prompt[i]) << "hit " << i;
        hits += *cached > 0 ? 1 : 0;
        write(next, *cached);
        ++next;
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        const KvPages::SeqId id = it->first;
        if (op < 6) {  // append 1-4 tokens
          const std::vector<int32_t> more = random_tokens(1 + static_cast<int>(rng() % 4));
          const auto ops = kv.append(id, more);
          if (!ops) {
            ++refused;
            continue;
          }
          for (const auto& c : *ops) {
            for (int64_t r = 0; r < c.rows; ++r) {
              pool[static_cast<size_t>(c.dst)][static_cast<size_t>(r)] =
                  pool[static_cast<size_t>(c.src)][static_cast<size_t>(r)];
            }
          }
          copies += static_cast<int>(ops->size());
          const auto from = static_cast<int64_t>(live[id].size());
          live[id].insert(live[id].end(), more.begin(), more.end());
          write(id, from);
        } else if (op < 8) {  // fork
          kv.fork(id, next);
          live[next] = live[id];
          ++next;
        } else {
          kv.free(id);
          live.erase(id);
        }
      }
      // Every sequence reads back its tokens; the pages add up.
      std::map<int32_t, int32_t> refs;
      for (const auto& [id, t] : live) {
        ASSERT_EQ(kv.tokens(id), static_cast<int64_t>(t.size()));
        ASSERT_EQ(static_cast<int64_t>(kv.page_table(id).size()),
                  kv.pages_for(static_cast<int64_t>(t.size())));
        for (int64_t i = 0; i < static_cast<int64_t>(t.size()); ++i) {
          ASSERT_EQ(row(id, i), t[static_cast<size_t>(i)])
              << "page size " << page_size << " step " << step << " sequence " << id;
        }
        for (const int32_t p : kv.page_table(id)) ++refs[p];
      }
      for (const auto& [p, n] : refs) ASSERT_EQ(kv.ref_count(p), n);
      const auto st = kv.stats();
      ASSERT_EQ(st.in_use, static_cast<int64_t>(refs.size()));
      ASSERT_EQ(st.in_use + st.cached + st.free, num_pages);
    }
    // The walk exercised what it is for.
    EXPECT_GT(hits, 20) << page_size;
    if (page_size > 1) {  // pages of one token are never partial
      EXPECT_GT(copies, 20) << page_size;
    }
    EXPECT_GT(refused, 5) << page_size;
    EXPECT_GT(kv.stats().evictions, 5) << page_size;
  }
}

}  // namespace
}  // namespace llmk
