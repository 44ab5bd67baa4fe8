#include "core/thread_pool.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <vector>

#include "core/error.h"

namespace llmk {
namespace {

TEST(ThreadPool, CoversEveryIndexOnceAndRethrows) {
  ThreadPool pool(4);
  for (int64_t n : {1, 7, 1000, 12345}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
  EXPECT_THROW(pool.parallel_for(100, 1,
                                 [](int64_t b, int64_t) {
                                   if (b > 50) throw Error("boom");
                                 }),
               Error);
}

// Loops started from several threads at once each cover their own range exactly once, and a
// loop started inside a chunk runs inline instead of corrupting the running one.
TEST(ThreadPool, ConcurrentAndNestedLoopsEachCoverTheirRange) {
  ThreadPool pool(3);
  constexpr int64_t kN = 5000;
  auto run = [&](std::vector<std::atomic<int>>& hits) {
    for (int rep = 0; rep < 50; ++rep) {
      pool.parallel_for(kN, 7, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      });
    }
  };
  std::vector<std::atomic<int>> a(kN), b(kN);
  std::thread other([&] { run(b); });
  run(a);
  other.join();
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_EQ(a[static_cast<size_t>(i)].load(), 50) << i;
    ASSERT_EQ(b[static_cast<size_t>(i)].load(), 50) << i;
  }
  std::vector<std::atomic<int>> nested(100 * 100);
  pool.parallel_for(100, 1, [&](int64_t b0, int64_t e0) {
    for (int64_t i = b0; i < e0; ++i) {
      pool.parallel_for(100, 1, [&](int64_t b1, int64_t e1) {
        for (int64_t j = b1; j < e1; ++j) nested[static_cast<size_t>(i * 100 + j)]++;
      });
    }
  });
  for (auto& h : nested) ASSERT_EQ(h.load(), 1);
}

// Limits this process's address space to what it uses now plus `extra` bytes.
void limit_address_space(size_t extra) {
  size_t pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  ASSERT_GT(pages, 0u);
  const auto limit =
      static_cast<rlim_t>(pages * static_cast<size_t>(::sysconf(_SC_PAGESIZE)) + extra);
  const rlimit r{limit, limit};
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &r), 0);
}

// A thread that cannot start (as under `ulimit -v` with many threads) makes the constructor throw
// llmk::Error after joining the threads it did start: never a hang, never std::terminate. Runs in
// a child process, whose address space is capped to leave room for a few thread stacks only.
TEST(ThreadPoolDeathTest, ThreadThatCannotStartThrows) {
  GTEST_FLAG_SET(death_test_style, "fast");  // fork: the child keeps the limit set in it
  EXPECT_EXIT(
      {
        ::alarm(60);  // a hang ends the child with SIGALRM, which fails the expectation
        limit_address_space(size_t{64} << 20);
        try {
          ThreadPool pool(200);
          std::fprintf(stderr, "all %d threads started despite the limit\n", pool.num_threads());
          std::_Exit(0);
        } catch (const Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::_Exit(3);
        }
      },
      ::testing::ExitedWithCode(3),
      "cannot start a pool of 200 CPU threads: thread [0-9]+ failed to start");
}

}  // namespace
}  // namespace llmk
