// Caching allocator for device memory.
//
// cudaMalloc and cudaFree are slow and synchronise the device, so freed blocks stay cached and
// are handed out again; in a steady state (a decode loop allocating the same sizes each step) no
// cudaMalloc happens at all.
//
// Size classes: requests under 1 MiB are rounded up to a multiple of 512 B and carved from 2 MiB
// segments (the small pool); larger requests are rounded up to a multiple of 2 MiB and get a
// segment of exactly that size (the large pool). A request takes the smallest cached block that
// fits (best fit), and the block is split so that the request keeps only its rounded size: the
// rest stays cached, so a small request never pins a big block and waste is the rounding alone.
// Freed blocks merge with free neighbours of the same segment; trim() returns wholly free
// segments to the device. Blocks are aligned to 512 bytes.
//
// Freed memory is reused at once without waiting for the device. That is safe because all llmk
// work runs in order on one stream (cuda::current_stream()) and cudaFree synchronises; memory used
// by another stream must be synchronised before it is freed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/tensor.h"

namespace llmk::cuda {

struct AllocatorStats {
  size_t bytes_in_use = 0;    // bytes of blocks handed out (rounded sizes)
  size_t bytes_reserved = 0;  // bytes held from cudaMalloc (in use + cached)
  size_t peak_in_use = 0;     // highest bytes_in_use since construction or reset_peak()
  size_t peak_reserved = 0;
  uint64_t num_device_allocs = 0;  // successful cudaMalloc calls
  uint64_t num_device_frees = 0;   // cudaFree calls
  uint64_t num_allocs = 0;         // successful allocate() calls
  uint64_t num_cache_hits = 0;     // ... of which were served from cached memory
  double fragmentation = 0;        // cached-but-free bytes / bytes_reserved; 0 when none reserved
};
// One line for logs: "in use 12.0 MiB (peak 20.0 MiB), reserved 24.0 MiB (peak 24.0 MiB), ...".
std::string to_string(const AllocatorStats& s);

// Where segments come from: the CUDA device, or a fake in tests of the caching logic.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Returns nullptr when the device is out of memory; throws llmk::Error on any other failure.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* ptr) = 0;
  virtual std::pair<size_t, size_t> mem_info() = 0;  // (free, total) bytes
};
// cudaMalloc / cudaFree / cudaMemGetInfo on the current device.
std::unique_ptr<DeviceMemory> cuda_device_memory();

class CachingAllocator {
 public:
  static constexpr size_t kSmallLimit = size_t{1} << 20;  // requests below go to the small pool
  static constexpr size_t kSmallRound = 512;
  static constexpr size_t kLargeRound = size_t{2} << 20;
  static constexpr size_t kSmallSegment = size_t{2} << 20;

  explicit CachingAllocator(std::unique_ptr<DeviceMemory> memory);
  // Releases every segment, including blocks still handed out.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // The size a request of `bytes` occupies: a multiple of 512 B below 1 MiB (at least 512), else
  // a multiple of 2 MiB.
  static size_t round_size(size_t bytes);

  // A block of at least `bytes` (0 gives a 512-byte block). When the device is out of memory,
  // frees the cached segments and retries once; then throws llmk::Error "out of GPU memory: ...".
  void* allocate(size_t bytes);
  // Returns a block from allocate() to the cache; nullptr is ignored. Throws llmk::Error for a
  // pointer this allocator did not hand out.
  void deallocate(void* ptr);

  AllocatorStats stats() const;
  // Peaks restart from the current values.
  void reset_peak();
  // cudaFree's every wholly free cached segment.
  void trim();

 private:
  struct Block;
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeList = std::set<Block*, BySize>;

  FreeList& free_list(const Block* b);
  Block* new_segment(size_t segment_bytes, bool small, size_t requested);
  void split(Block* b, size_t size);
  void release_free_segments();
  size_t total_memory();
  [[noreturn]] void throw_out_of_memory(size_t requested);

  std::unique_ptr<DeviceMemory> memory_;
  mutable std::mutex mu_;
  FreeList small_free_, large_free_;
  std::unordered_map<void*, Block*> in_use_;
  AllocatorStats stats_;
  size_t total_memory_ = 0;  // device memory size, read on the first cudaMalloc
};

// The process-wide allocator over the CUDA device (never destroyed, so tensors released during
// static destruction stay safe).
CachingAllocator& allocator();

// A Device::CUDA tensor whose elements live in pinned host memory that kernels read over the
// bus (mapped, portable; with unified addressing its address is the same on both sides): for
// tables a step reads a few rows of, such as token embeddings. `host` gets a Device::CPU view of
// the same memory, to fill it. Not from allocator() and not in its stats. Throws llmk::Error when
// the host cannot pin that much.
Tensor host_mapped_tensor(const Shape& shape, DType dtype, Tensor* host);

// Serves Device::CUDA tensors from allocator(); the tensors' deleters return their blocks to it.
// Idempotent; cuda::init() calls it.
void install_allocator();

}  // namespace llmk::cuda
