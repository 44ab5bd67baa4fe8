// A fixed pool of worker threads for data-parallel loops on the CPU. The calling thread takes
// part in every loop, so a pool of N threads runs N-1 workers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace llmk {

class ThreadPool {
 public:
  // Throws llmk::Error when a thread cannot be started (the system's thread or memory limits);
  // the threads started before it are stopped and joined first.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n), each at least `grain` long
  // (except the last), and returns when all are done. Exceptions from fn are rethrown here.
  // Loops called from several threads at once run one after another; a loop called from inside
  // fn (on any pool) runs on the calling thread alone.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  void stop_workers();  // wakes every worker with stop_ set and joins it
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex loop_mu_;  // held by the thread whose loop the workers run
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  // Written under mu_, read without it while spinning: a decode step runs hundreds of short
  // loops, and waking a sleeping thread costs more than most of them take.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> busy_{0};
  // The current loop.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0, num_chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  std::exception_ptr error_;
};

// The process-wide pool used by CPU kernels. Defaults to the number of hardware threads.
ThreadPool& cpu_pool();
// Replaces the process-wide pool; n <= 0 means the hardware thread count.
void set_num_threads(int n);

}  // namespace llmk
