// CUDA core utilities: error checks, device properties, streams, the caching allocator and
// Tensor::to. The allocator's bookkeeping is checked twice: against a fake DeviceMemory (exact
// addresses, simulated out-of-memory) and against the real device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops_gpu_util.h"

namespace llmk::cuda {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kPiB = size_t{1} << 50;

using gpu_test::error_message;

// ---------------------------------------------------------------------------------------------
// Fake device memory: hands out addresses (never dereferenced) from a fixed capacity, and counts.

struct FakeState {
  size_t capacity = 0;
  size_t used = 0;
  int allocs = 0;    // successful allocate() calls
  int failures = 0;  // allocate() calls answered with nullptr
  int releases = 0;
  uintptr_t next = uintptr_t{1} << 40;
  std::map<uintptr_t, size_t> live;
};

class FakeMemory final : public DeviceMemory {
 public:
  explicit FakeMemory(std::shared_ptr<FakeState> s) : s_(std::move(s)) {}
  void* allocate(size_t bytes) override {
    if (s_->used + bytes > s_->capacity) {
      ++s_->failures;
      return nullptr;
    }
    const uintptr_t p = s_->next;
    s_->next += (bytes + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB) + 2 * kMiB;  // segments apart
    s_->used += bytes;
    s_->live[p] = bytes;
    ++s_->allocs;
    return reinterpret_cast<void*>(p);
  }
  void release(void* ptr) override {
    const auto it = s_->live.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == s_->live.end()) throw Error("fake device: release of unknown pointer");
    s_->used -= it->second;
    s_->live.erase(it);
    ++s_->releases;
  }
  std::pair<size_t, size_t> mem_info() override { return {s_->capacity - s_->used, s_->capacity}; }

 private:
  std::shared_ptr<FakeState> s_;
};

struct FakeAllocator {
  explicit FakeAllocator(size_t capacity = 64 * kGiB)
      : state(std::make_shared<FakeState>()),
        alloc((state->capacity = capacity, std::make_unique<FakeMemory>(state))) {}
  std::shared_ptr<FakeState> state;
  CachingAllocator alloc;
};

ptrdiff_t distance(void* from, void* to) {
  return static_cast<char*>(to) - static_cast<char*>(from);
}

// A fixed sequence whose every statistic is known; run on the fake and on the real device.
void check_known_sequence(CachingAllocator& a) {
  void* pa = a.allocate(1);  // 512 B from a new 2 MiB small segment
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 512u);
  EXPECT_EQ(s.bytes_reserved, 2 * kMiB);
  EXPECT_EQ(s.num_device_allocs, 1u);
  EXPECT_EQ(s.num_allocs, 1u);
  EXPECT_EQ(s.num_cache_hits, 0u);

  void* pb = a.allocate(1000);  // 1024 B from the rest of that segment
  EXPECT_EQ(distance(pa, pb), 512);
  s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 1536u);
  EXPECT_EQ(s.bytes_reserved, 2 * kMiB);
  EXPECT_EQ(s.num_device_allocs, 1u);
  EXPECT_EQ(s.num_cache_hits, 1u);

  void* pc = a.allocate(3 * kMiB);  // 4 MiB segment
  void* pd = a.allocate(5 * kMiB);  // 6 MiB segment
  s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 1536 + 10 * kMiB);
  EXPECT_EQ(s.bytes_reserved, 12 * kMiB);
  EXPECT_EQ(s.num_device_allocs, 3u);
  EXPECT_EQ(s.num_allocs, 4u);
  EXPECT_EQ(s.peak_in_use, 1536 + 10 * kMiB);
  EXPECT_EQ(s.peak_reserved, 12 * kMiB);

  a.deallocate(pc);
  s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 1536 + 6 * kMiB);
  EXPECT_DOUBLE_EQ(s.fragmentation, static_cast<double>(12 * kMiB - (1536 + 6 * kMiB)) /
                                        static_cast<double>(12 * kMiB));

  void* pe = a.allocate(2 * kMiB + 1);  // 4 MiB: the block pc had
  EXPECT_EQ(pe, pc);
  a.deallocate(pb);            // merges with the free rest of the small segment
  void* pf = a.allocate(100);  // best fit: that merged block, split again
  EXPECT_EQ(pf, pb);
  s = a.stats();
  EXPECT_EQ(s.num_cache_hits, 3u);
  EXPECT_EQ(s.num_allocs, 6u);
  EXPECT_EQ(s.num_device_allocs, 3u);
  EXPECT_EQ(s.bytes_in_use, 1024 + 10 * kMiB);

  a.deallocate(pa);
  a.deallocate(pf);
  a.trim();  // only the small segment is wholly free
  s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 10 * kMiB);
  EXPECT_EQ(s.bytes_reserved, 10 * kMiB);
  EXPECT_EQ(s.num_device_frees, 1u);

  a.deallocate(pd);
  a.deallocate(pe);
  s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.bytes_reserved, 10 * kMiB);
  EXPECT_DOUBLE_EQ(s.fragmentation, 1.0);
  EXPECT_EQ(s.peak_in_use, 1536 + 10 * kMiB);
  EXPECT_EQ(s.peak_reserved, 12 * kMiB);

  a.reset_peak();
  s = a.stats();
  EXPECT_EQ(s.peak_in_use, 0u);
  EXPECT_EQ(s.peak_reserved, 10 * kMiB);

  a.trim();
  s = a.stats();
  EXPECT_EQ(s.bytes_reserved, 0u);
  EXPECT_EQ(s.num_device_allocs, 3u);
  EXPECT_EQ(s.num_device_frees, 3u);
  EXPECT_EQ(s.num_allocs, 6u);
  EXPECT_EQ(s.num_cache_hits, 3u);
  EXPECT_DOUBLE_EQ(s.fragmentation, 0.0);
}

// Allocates a fixed mix of sizes, frees them in a shuffled order, `rounds` times; returns
// num_device_allocs after each round.
std::vector<uint64_t> run_rounds(CachingAllocator& a, int rounds) {
  const std::vector<size_t> sizes = {100,     1000,     4096,         300000,        700000,
                                     1000000, 1 * kMiB, 3 * kMiB,     17 * kMiB + 5, 64 * kMiB,
                                     512,     7,        2 * kMiB - 1, 4096};
  std::mt19937 rng(7);
  std::vector<uint64_t> device_allocs;
  for (int r = 0; r < rounds; ++r) {
    std::vector<void*> ptrs;
    for (size_t n : sizes) ptrs.push_back(a.allocate(n));
    std::shuffle(ptrs.begin(), ptrs.end(), rng);
    for (void* p : ptrs) a.deallocate(p);
    device_allocs.push_back(a.stats().num_device_allocs);
  }
  return device_allocs;
}

void check_steady_state(CachingAllocator& a) {
  const uint64_t allocs_before = a.stats().num_allocs;
  const uint64_t hits_before = a.stats().num_cache_hits;
  const std::vector<uint64_t> device_allocs = run_rounds(a, 8);
  ASSERT_GT(device_allocs[0], 0u);
  for (size_t r = 1; r < device_allocs.size(); ++r) {
    EXPECT_EQ(device_allocs[r], device_allocs[0]) << "round " << r << " called cudaMalloc";
  }
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.num_allocs - allocs_before, 8u * 14u);
  EXPECT_GE(s.num_cache_hits - hits_before, 7u * 14u);  // every allocation after round 0
  EXPECT_GT(s.fragmentation, 0.0);
  EXPECT_LE(s.fragmentation, 1.0);
}

TEST(CachingAllocatorLogic, RoundsToSizeClasses) {
  EXPECT_EQ(CachingAllocator::round_size(0), 512u);
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(kMiB - 1), kMiB);
  EXPECT_EQ(CachingAllocator::round_size(kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::round_size(2 * kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::round_size(2 * kMiB + 1), 4 * kMiB);
  EXPECT_EQ(CachingAllocator::round_size(kGiB + 1), kGiB + 2 * kMiB);
}

TEST(CachingAllocatorLogic, StatsOfAKnownSequenceAreExact) {
  FakeAllocator f;
  check_known_sequence(f.alloc);
  EXPECT_EQ(f.state->allocs, 3);
  EXPECT_EQ(f.state->releases, 3);
  EXPECT_EQ(f.state->used, 0u);
}

TEST(CachingAllocatorLogic, SteadyStateNeedsNoDeviceAllocations) {
  FakeAllocator f;
  check_steady_state(f.alloc);
  f.alloc.trim();
  EXPECT_EQ(f.alloc.stats().bytes_reserved, 0u);
  EXPECT_EQ(f.state->used, 0u);
}

TEST(CachingAllocatorLogic, SmallRequestsNeverTakeLargeBlocks) {
  FakeAllocator f;
  CachingAllocator& a = f.alloc;
  a.deallocate(a.allocate(64 * kMiB));
  void* small = a.allocate(1000);  // small pool: a new 2 MiB segment, the 64 MiB block untouched
  EXPECT_EQ(a.stats().num_device_allocs, 2u);
  EXPECT_EQ(a.stats().bytes_in_use, 1024u);
  EXPECT_EQ(a.stats().bytes_reserved, 66 * kMiB);
  a.deallocate(small);
  a.trim();
  EXPECT_EQ(a.stats().bytes_reserved, 0u);
}

TEST(CachingAllocatorLogic, BestFitThenSplitBoundsTheWaste) {
  FakeAllocator f;
  CachingAllocator& a = f.alloc;
  void* big = a.allocate(64 * kMiB);
  void* mid = a.allocate(4 * kMiB);
  a.deallocate(big);
  a.deallocate(mid);
  EXPECT_EQ(a.allocate(4 * kMiB), mid);  // the exact fit, not the 64 MiB block
  void* part = a.allocate(8 * kMiB);     // carved from the 64 MiB block
  EXPECT_EQ(part, big);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.num_device_allocs, 2u);
  EXPECT_EQ(s.bytes_in_use, 12 * kMiB);  // the 8 MiB request holds 8 MiB, not 64
  void* rest = a.allocate(56 * kMiB);    // the remainder of the 64 MiB block
  EXPECT_EQ(distance(big, rest), static_cast<ptrdiff_t>(8 * kMiB));
  EXPECT_EQ(a.stats().num_device_allocs, 2u);
  a.deallocate(part);
  a.deallocate(rest);
  a.deallocate(mid);
  a.trim();  // the pieces merged back into whole segments
  s = a.stats();
  EXPECT_EQ(s.bytes_reserved, 0u);
  EXPECT_EQ(s.num_device_frees, 2u);
}

TEST(CachingAllocatorLogic, FreedNeighboursMergeInAnyOrder) {
  FakeAllocator f;
  CachingAllocator& a = f.alloc;
  void* x = a.allocate(1000);
  void* y = a.allocate(5000);
  void* z = a.allocate(30000);
  a.deallocate(x);
  a.deallocate(z);
  a.trim();  // y still pins the segment
  EXPECT_EQ(a.stats().bytes_reserved, 2 * kMiB);
  a.deallocate(y);
  a.trim();
  EXPECT_EQ(a.stats().bytes_reserved, 0u);
  EXPECT_EQ(f.state->releases, 1);
}

TEST(CachingAllocatorLogic, OutOfMemoryTrimsRetriesThenThrows) {
  FakeAllocator f(16 * kMiB);
  CachingAllocator& a = f.alloc;
  a.deallocate(a.allocate(8 * kMiB));
  void* p = a.allocate(12 * kMiB);  // fails while 8 MiB are cached: trim, retry, succeed
  EXPECT_EQ(f.state->failures, 1);
  EXPECT_EQ(f.state->releases, 1);
  EXPECT_EQ(a.stats().bytes_reserved, 12 * kMiB);

  EXPECT_EQ(error_message([&] { a.allocate(12 * kMiB); }),
            "out of GPU memory: requested 12.0 MiB, 4.0 MiB free of 16.0 MiB (llmk holds 12.0 MiB "
            "reserved, 12.0 MiB in use)");
  EXPECT_EQ(f.state->failures, 3);  // first try and the retry after trimming

  const int failures = f.state->failures;
  const std::string msg = error_message([&] { a.allocate(kPiB); });
  EXPECT_NE(msg.find("out of GPU memory: requested 1073741824.0 MiB"), std::string::npos) << msg;
  EXPECT_NE(error_message([&] { a.allocate(SIZE_MAX); }).find("out of GPU memory"),
            std::string::npos);
  EXPECT_EQ(f.state->failures, failures);  // beyond the device's size: not even tried

  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.num_allocs, 2u);
  EXPECT_EQ(s.bytes_in_use, 12 * kMiB);
  a.deallocate(p);
}

TEST(CachingAllocatorLogic, RejectsUnknownPointersAndIgnoresNull) {
  FakeAllocator f;
  int local = 0;
  EXPECT_THROW(f.alloc.deallocate(&local), Error);
  EXPECT_NO_THROW(f.alloc.deallocate(nullptr));
  void* p = f.alloc.allocate(10);
  f.alloc.deallocate(p);
  EXPECT_THROW(f.alloc.deallocate(p), Error);  // double free
}

TEST(CachingAllocatorLogic, DestructorReleasesEverySegment) {
  auto state = std::make_shared<FakeState>();
  state->capacity = 64 * kGiB;
  {
    CachingAllocator a(std::make_unique<FakeMemory>(state));
    (void)a.allocate(100);
    (void)a.allocate(3 * kMiB);
    a.deallocate(a.allocate(5 * kMiB));
  }
  EXPECT_EQ(state->allocs, 3);
  EXPECT_EQ(state->releases, 3);
  EXPECT_EQ(state->used, 0u);
}

TEST(CachingAllocatorLogic, ConcurrentUseKeepsTheBooksBalanced) {
  FakeAllocator f;
  CachingAllocator& a = f.alloc;
  constexpr int kThreads = 4, kIters = 3000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&a, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::uniform_int_distribution<size_t> small(1, 200000), large(kMiB, 40 * kMiB);
      std::vector<void*> held;
      for (int i = 0; i < kIters; ++i) {
        if (held.size() > 8 || (!held.empty() && rng() % 3 == 0)) {
          const size_t j = rng() % held.size();
          a.deallocate(held[j]);
          held.erase(held.begin() + static_cast<ptrdiff_t>(j));
        } else {
          held.push_back(a.allocate(rng() % 4 == 0 ? large(rng) : small(rng)));
        }
      }
      for (void* p : held) a.deallocate(p);
    });
  }
  for (std::thread& th : threads) th.join();
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.bytes_reserved, f.state->used);
  EXPECT_EQ(s.num_device_allocs, static_cast<uint64_t>(f.state->allocs));
  a.trim();
  EXPECT_EQ(a.stats().bytes_reserved, 0u);
  EXPECT_EQ(f.state->used, 0u);
}

// ---------------------------------------------------------------------------------------------
// The real device.

TEST(CudaCheck, MacroNamesTheErrorTheExpressionAndTheLocation) {
  int n = 0;
  LLMK_CUDA_CHECK(cudaGetDeviceCount(&n));
  const std::string msg = error_message([n] { LLMK_CUDA_CHECK(cudaSetDevice(n)); });
  EXPECT_NE(msg.find("CUDA error cudaErrorInvalidDevice ("), std::string::npos) << msg;
  EXPECT_NE(msg.find(") in cudaSetDevice(n) at "), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuda_core_test.cpp:"), std::string::npos) << msg;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cleared, so it cannot resurface later
}

TEST(CudaCheck, CheckLaunchReportsThePendingErrorOnce) {
  EXPECT_NO_THROW(check_launch("nothing_yet"));
  void* p = nullptr;
  ASSERT_NE(cudaMalloc(&p, kPiB), cudaSuccess);  // leaves a (non-sticky) last error behind
  const std::string msg = error_message([] { check_launch("fake_op"); });
  EXPECT_EQ(msg.rfind("CUDA error in fake_op: cuda", 0), 0u) << msg;
  EXPECT_NO_THROW(check_launch("fake_op"));
}

TEST(CudaDevice, InfoIsReadFromTheDevice) {
  ASSERT_TRUE(available());
  EXPECT_EQ(unavailable_reason(), "");
  const DeviceInfo& info = device_info();
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, info.id), cudaSuccess);
  EXPECT_FALSE(info.name.empty());
  EXPECT_EQ(info.name, prop.name);
  EXPECT_GT(info.sm_count, 0);
  EXPECT_EQ(info.sm_count, prop.multiProcessorCount);
  EXPECT_EQ(info.compute_capability(), prop.major * 10 + prop.minor);
  EXPECT_GE(info.cc_major, 7);
  EXPECT_GT(info.total_memory, kGiB);
  EXPECT_GT(info.l2_bytes, 0u);
  EXPECT_GE(info.max_smem_per_block_optin, size_t{48} << 10);
  EXPECT_GE(info.smem_per_sm, info.max_smem_per_block_optin);
  EXPECT_EQ(info.warp_size, 32);
  EXPECT_GT(info.max_threads_per_sm, 0);
  EXPECT_EQ(&device_info(), &info);  // read once

  const auto [free_bytes, total_bytes] = mem_info();
  EXPECT_EQ(total_bytes, info.total_memory);
  EXPECT_GT(free_bytes, 0u);
  EXPECT_LE(free_bytes, total_bytes);
}

TEST(CudaStream, DefaultIsNonBlockingAndOverridesArePerThread) {
  const cudaStream_t def = default_stream();
  ASSERT_NE(def, nullptr);
  EXPECT_EQ(current_stream(), def);
  unsigned flags = 0;
  LLMK_CUDA_CHECK(cudaStreamGetFlags(def, &flags));
  EXPECT_EQ(flags & cudaStreamNonBlocking, static_cast<unsigned>(cudaStreamNonBlocking));

  cudaStream_t mine = nullptr;
  LLMK_CUDA_CHECK(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
  {
    StreamGuard guard(mine);
    EXPECT_EQ(current_stream(), mine);
    cudaStream_t seen_by_other = nullptr;
    std::thread([&] { seen_by_other = current_stream(); }).join();
    EXPECT_EQ(seen_by_other, def);
  }
  EXPECT_EQ(current_stream(), def);
  set_current_stream(mine);
  EXPECT_EQ(current_stream(), mine);
  set_current_stream(nullptr);
  EXPECT_EQ(current_stream(), def);
  LLMK_CUDA_CHECK(cudaStreamDestroy(mine));
}

TEST(CudaStream, DefaultStreamCanBeCapturedIntoAGraph) {
  const cudaStream_t s = default_stream();
  void* buf = nullptr;
  LLMK_CUDA_CHECK(cudaMalloc(&buf, 4096));
  LLMK_CUDA_CHECK(cudaMemsetAsync(buf, 0, 4096, s));
  cudaGraph_t graph = nullptr;
  LLMK_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  LLMK_CUDA_CHECK(cudaMemsetAsync(buf, 0x5a, 4096, s));
  LLMK_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  LLMK_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  LLMK_CUDA_CHECK(cudaGraphLaunch(exec, s));
  std::vector<unsigned char> host(4096, 0);
  memcpy_sync(host.data(), buf, host.size(), cudaMemcpyDeviceToHost);
  for (unsigned char c : host) ASSERT_EQ(c, 0x5a);
  LLMK_CUDA_CHECK(cudaGraphExecDestroy(exec));
  LLMK_CUDA_CHECK(cudaGraphDestroy(graph));
  LLMK_CUDA_CHECK(cudaFree(buf));
}

TEST(CudaAllocator, StatsOfAKnownSequenceAreExact) {
  CachingAllocator a(cuda_device_memory());
  check_known_sequence(a);
}

TEST(CudaAllocator, SteadyStateNeedsNoCudaMalloc) {
  CachingAllocator a(cuda_device_memory());
  check_steady_state(a);
}

TEST(CudaAllocator, BlocksAreAlignedDistinctAndUsable) {
  CachingAllocator a(cuda_device_memory());
  std::vector<size_t> sizes;
  for (int i = 0; i < 40; ++i) sizes.push_back(static_cast<size_t>(1 + 37 * i * i * i));
  sizes.push_back(3 * kMiB + 3);
  std::vector<void*> ptrs;
  for (size_t n : sizes) {
    void* p = a.allocate(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 512, 0u);
    cudaPointerAttributes attr{};
    LLMK_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
    ptrs.push_back(p);
  }
  // Fill each block with its own byte, then read every block back: overlapping blocks would
  // show another block's byte.
  for (size_t i = 0; i < ptrs.size(); ++i) {
    LLMK_CUDA_CHECK(cudaMemsetAsync(ptrs[i], static_cast<int>(i + 1), sizes[i], current_stream()));
  }
  for (size_t i = 0; i < ptrs.size(); ++i) {
    std::vector<unsigned char> host(sizes[i], 0);
    memcpy_sync(host.data(), ptrs[i], sizes[i], cudaMemcpyDeviceToHost);
    for (unsigned char c : host) ASSERT_EQ(c, static_cast<unsigned char>(i + 1)) << "block " << i;
  }
  for (void* p : ptrs) a.deallocate(p);
  EXPECT_EQ(a.stats().bytes_in_use, 0u);
}

TEST(CudaAllocator, TrimGivesMemoryBackToTheDevice) {
  CachingAllocator a(cuda_device_memory());
  const size_t slack = 64 * kMiB;
  const size_t free0 = mem_info().first;
  if (free0 < 4 * kGiB) GTEST_SKIP() << "needs 4 GiB free device memory";
  void* p = a.allocate(kGiB);
  const size_t free1 = mem_info().first;
  EXPECT_LE(free1 + kGiB, free0 + slack);
  a.deallocate(p);
  const size_t free2 = mem_info().first;
  EXPECT_LE(free2 + kGiB, free0 + slack);  // still cached
  EXPECT_EQ(a.stats().bytes_reserved, kGiB);
  a.trim();
  EXPECT_EQ(a.stats().bytes_reserved, 0u);
  EXPECT_DOUBLE_EQ(a.stats().fragmentation, 0.0);
  EXPECT_GE(mem_info().first + slack, free0);
}

TEST(CudaAllocator, OutOfMemoryIsAClearError) {
  init();
  const std::string absurd = error_message([] { allocator().allocate(kPiB); });
  EXPECT_NE(absurd.find("out of GPU memory"), std::string::npos) << absurd;
  EXPECT_NE(absurd.find("MiB"), std::string::npos) << absurd;
  EXPECT_NE(absurd.find("MiB free of"), std::string::npos) << absurd;
  const std::string tensor =
      error_message([] { Tensor::empty({static_cast<int64_t>(kPiB)}, DType::I8, Device::CUDA); });
  EXPECT_NE(tensor.find("out of GPU memory"), std::string::npos) << tensor;

  // A request below the device's size but above what is free reaches cudaMalloc and fails there.
  CachingAllocator a(cuda_device_memory());
  const auto [free_bytes, total_bytes] = mem_info();
  const size_t request = std::min(free_bytes + 256 * kMiB, total_bytes - 2 * kMiB);
  const std::string real = error_message([&] { a.allocate(request); });
  EXPECT_EQ(real.rfind("out of GPU memory: requested ", 0), 0u) << real;
  EXPECT_NE(real.find("llmk holds 0.0 MiB reserved, 0.0 MiB in use"), std::string::npos) << real;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the failed cudaMalloc left nothing behind
  void* p = a.allocate(kMiB);                  // and the allocator still works
  a.deallocate(p);
  EXPECT_EQ(a.stats().num_allocs, 1u);
}

TEST(CudaAllocator, TensorsOnCudaComeFromTheCachingAllocator) {
  init();
  init();  // idempotent
  allocator().trim();
  const AllocatorStats before = allocator().stats();
  {
    Tensor t = Tensor::empty({1000, 3}, DType::BF16, Device::CUDA);
    EXPECT_EQ(t.device(), Device::CUDA);
    cudaPointerAttributes attr{};
    LLMK_CUDA_CHECK(cudaPointerGetAttributes(&attr, t.data()));
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
    const AllocatorStats during = allocator().stats();
    EXPECT_EQ(during.num_allocs, before.num_allocs + 1);
    EXPECT_EQ(during.bytes_in_use, before.bytes_in_use + 6144);
  }
  EXPECT_EQ(allocator().stats().bytes_in_use, before.bytes_in_use);  // the deleter gave it back

  // Steady state through Tensor::empty, as a decode loop would allocate.
  std::vector<uint64_t> device_allocs;
  for (int round = 0; round < 5; ++round) {
    std::vector<Tensor> ts;
    for (int64_t n : {1, 4096, 100000, 576 * 2048, 49152 * 3, 3 * 1024 * 1024})
      ts.push_back(Tensor::empty({n}, DType::BF16, Device::CUDA));
    device_allocs.push_back(allocator().stats().num_device_allocs);
  }
  for (size_t r = 1; r < device_allocs.size(); ++r) EXPECT_EQ(device_allocs[r], device_allocs[0]);
}

// ---------------------------------------------------------------------------------------------
// Tensor::to

Tensor random_cpu(const Shape& shape, DType dtype, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* bytes = t.data<unsigned char>();
  for (int64_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(rng());
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.nbytes())) == 0;
}

TEST(TensorTo, RoundTripKeepsEveryByte) {
  init();
  std::mt19937 rng(1234);
  const std::vector<std::pair<Shape, DType>> cases = {
      {{37, 1001}, DType::F32}, {{3, 5, 7}, DType::BF16}, {{4, 256}, DType::Q4_K},
      {{2, 64}, DType::Q8_0},   {{0, 8}, DType::F32},     {{}, DType::F32},
  };
  for (const auto& [shape, dtype] : cases) {
    SCOPED_TRACE(shape_str(shape) + " " + std::string(dtype_name(dtype)));
    const Tensor host = random_cpu(shape, dtype, rng);
    const Tensor dev = host.to(Device::CUDA);
    EXPECT_EQ(dev.device(), Device::CUDA);
    EXPECT_EQ(dev.shape(), host.shape());
    EXPECT_EQ(dev.dtype(), host.dtype());
    const Tensor dev2 = dev.to(Device::CUDA);  // device to device: a new copy
    EXPECT_NE(dev2.data(), dev.data());
    const Tensor back = dev2.to(Device::CPU);
    EXPECT_EQ(back.device(), Device::CPU);
    EXPECT_TRUE(same_bytes(back, host));
  }
}

TEST(TensorTo, StridedHostSourcesAndDeviceViews) {
  init();
  std::mt19937 rng(99);
  const Tensor host = random_cpu({6, 10}, DType::F32, rng);

  const Tensor tr = host.transpose(0, 1);  // non-contiguous on the host: packed on the way
  EXPECT_TRUE(same_bytes(tr.to(Device::CUDA).to(Device::CPU), tr.contiguous()));

  const Tensor dev = host.to(Device::CUDA);
  EXPECT_TRUE(same_bytes(dev.slice(0, 2, 5).to(Device::CPU), host.slice(0, 2, 5).contiguous()));
  EXPECT_TRUE(same_bytes(dev.select(0, 4).to(Device::CPU), host.select(0, 4).contiguous()));
  EXPECT_THROW(dev.transpose(0, 1).to(Device::CPU), Error);  // no strided device copy

  const Tensor cpu_copy = host.to(Device::CPU);
  EXPECT_NE(cpu_copy.data(), host.data());
  EXPECT_TRUE(same_bytes(cpu_copy, host));
}

TEST(TensorTo, CopiesRunOnTheCurrentStream) {
  init();
  cudaStream_t mine = nullptr;
  LLMK_CUDA_CHECK(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
  {
    StreamGuard guard(mine);
    std::mt19937 rng(5);
    const Tensor host = random_cpu({513, 77}, DType::BF16, rng);
    EXPECT_TRUE(same_bytes(host.to(Device::CUDA).to(Device::CPU), host));
  }
  LLMK_CUDA_CHECK(cudaStreamDestroy(mine));
}

}  // namespace
}  // namespace llmk::cuda
