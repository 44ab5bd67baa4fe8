#include "core/thread_pool.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
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
