#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/error.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LLMK_CPU_RELAX() _mm_pause()
#else
#define LLMK_CPU_RELAX() std::this_thread::yield()
#endif

namespace llmk {

namespace {
// Spins until done() or about `budget` has passed; true if done() became true. Bounded so an
// idle pool (or an oversubscribed machine) falls back to sleeping on a condition variable.
template <typename Done>
bool spin_until(Done done, std::chrono::microseconds budget) {
  const auto until = std::chrono::steady_clock::now() + budget;
  for (int i = 1;; ++i) {
    if (done()) return true;
    LLMK_CPU_RELAX();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() > until) return false;
  }
}
constexpr std::chrono::microseconds kSpin{200};
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  const int workers = std::max(1, num_threads) - 1;
  try {
    workers_.reserve(static_cast<size_t>(workers));
    for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { worker_loop(); });
  } catch (const std::exception& e) {
    // The destructor does not run for a constructor that throws: stop what started here.
    const size_t started = workers_.size();
    stop_workers();
    LLMK_FAIL(
        "cannot start a pool of {} CPU threads: thread {} failed to start ({}); use fewer "
        "threads",
        num_threads, started + 1, e.what());
  }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

// True on a thread running a chunk of some pool's loop: a loop it starts runs inline.
static thread_local bool t_in_loop = false;

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_chunk_ >= num_chunks_) return;
      c = next_chunk_++;
    }
    const int64_t begin = c * chunk_;
    const int64_t end = std::min(n_, begin + chunk_);
    t_in_loop = true;
    try {
      (*fn_)(begin, end);
      t_in_loop = false;
    } catch (...) {
      t_in_loop = false;
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    spin_until([&] { return stop_.load() || generation_.load(std::memory_order_acquire) != seen; },
               kSpin);
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      if (stop_) return;
      seen = generation_.load();
      ++busy_;
    }
    run_chunks();
    {
      std::lock_guard<std::mutex> lock(mu_);
      --busy_;
    }
    done_cv_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t threads = num_threads();
  if (threads == 1 || n <= grain || t_in_loop) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> one_loop_at_a_time(loop_mu_);
  // A few chunks per thread balances uneven work without much locking.
  int64_t chunks = std::min<int64_t>(threads * 4, (n + grain - 1) / grain);
  const int64_t chunk = (n + chunks - 1) / chunks;
  chunks = (n + chunk - 1) / chunk;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    num_chunks_ = chunks;
    next_chunk_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  run_chunks();
  std::exception_ptr error;
  spin_until([&] { return busy_.load() == 0 && next_chunk_.load() >= num_chunks_; }, kSpin);
  {
    std::unique_lock<std::mutex> lock(mu_);
    // Workers that woke late find no chunks left and leave at once; wait for all that joined.
    done_cv_.wait(lock, [&] { return busy_ == 0 && next_chunk_ >= num_chunks_; });
    fn_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

namespace {
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
int default_threads() { return std::max(1u, std::thread::hardware_concurrency()); }
}  // namespace

ThreadPool& cpu_pool() {
  auto& p = pool_slot();
  if (!p) p = std::make_unique<ThreadPool>(default_threads());
  return *p;
}

void set_num_threads(int n) {
  auto& p = pool_slot();
  p.reset();  // its threads first, so that the two pools never run side by side
  p = std::make_unique<ThreadPool>(n > 0 ? n : default_threads());
}

}  // namespace llmk
