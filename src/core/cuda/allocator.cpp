#include "core/cuda/allocator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/error.h"
#include "core/tensor.h"

namespace llmk::cuda {

namespace {

// Larger requests cannot be rounded without overflow; no device has this much memory anyway.
constexpr size_t kMaxRequest = size_t{1} << 60;

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

class CudaDeviceMemory final : public DeviceMemory {
 public:
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaSuccess) return p;
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not a sticky error: keep it out of the next check_launch
      return nullptr;
    }
    throw_cuda_error(err, "cudaMalloc", __FILE__, __LINE__);
  }
  void release(void* ptr) override { LLMK_CUDA_CHECK(cudaFree(ptr)); }
  std::pair<size_t, size_t> mem_info() override { return cuda::mem_info(); }
};

}  // namespace

std::string to_string(const AllocatorStats& s) {
  return fmt::format(
      "in use {:.1f} MiB (peak {:.1f} MiB), reserved {:.1f} MiB (peak {:.1f} MiB), "
      "{} cudaMalloc / {} cudaFree, {} allocs ({} from cache), fragmentation {:.2f}",
      mib(s.bytes_in_use), mib(s.peak_in_use), mib(s.bytes_reserved), mib(s.peak_reserved),
      s.num_device_allocs, s.num_device_frees, s.num_allocs, s.num_cache_hits, s.fragmentation);
}

std::unique_ptr<DeviceMemory> cuda_device_memory() { return std::make_unique<CudaDeviceMemory>(); }

// A piece of a segment. The blocks of one segment form a list in address order (prev/next);
// two neighbours are never both free, because a freed block merges with its free neighbours.
struct CachingAllocator::Block {
  char* ptr = nullptr;
  size_t size = 0;
  bool small = false;  // pool
  bool allocated = false;
  Block* prev = nullptr;
  Block* next = nullptr;
};

bool CachingAllocator::BySize::operator()(const Block* a, const Block* b) const {
  if (a->size != b->size) return a->size < b->size;
  return std::less<const char*>{}(a->ptr, b->ptr);
}

CachingAllocator::CachingAllocator(std::unique_ptr<DeviceMemory> memory)
    : memory_(std::move(memory)) {
  LLMK_CHECK(memory_ != nullptr, "CachingAllocator needs a DeviceMemory");
}

CachingAllocator::~CachingAllocator() {
  std::vector<Block*> blocks;
  for (const auto& [ptr, b] : in_use_) blocks.push_back(b);
  blocks.insert(blocks.end(), small_free_.begin(), small_free_.end());
  blocks.insert(blocks.end(), large_free_.begin(), large_free_.end());
  for (Block* b : blocks) {
    if (b->prev == nullptr) {  // the first block of a segment owns the segment's address
      try {
        memory_->release(b->ptr);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "llmk: freeing device memory at exit: %s\n", e.what());
      }
    }
  }
  for (Block* b : blocks) delete b;
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes < kSmallLimit) return bytes == 0 ? kSmallRound : round_up(bytes, kSmallRound);
  return round_up(bytes, kLargeRound);
}

CachingAllocator::FreeList& CachingAllocator::free_list(const Block* b) {
  return b->small ? small_free_ : large_free_;
}

void* CachingAllocator::allocate(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > kMaxRequest) throw_out_of_memory(bytes);
  const size_t size = round_size(bytes);
  const bool small = size <= kSmallLimit;
  FreeList& pool = small ? small_free_ : large_free_;

  Block key;
  key.size = size;
  const auto best = pool.lower_bound(&key);  // smallest cached block that fits
  Block* b = nullptr;
  const bool hit = best != pool.end();
  if (hit) {
    b = *best;
    pool.erase(best);
  } else {
    b = new_segment(small ? kSmallSegment : size, small, bytes);
  }
  if (b->size > size) split(b, size);
  b->allocated = true;
  in_use_.emplace(b->ptr, b);

  stats_.bytes_in_use += b->size;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.bytes_in_use);
  ++stats_.num_allocs;
  if (hit) ++stats_.num_cache_hits;
  return b->ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = in_use_.find(ptr);
  LLMK_CHECK(it != in_use_.end(), "CUDA allocator: freeing {}, which it did not allocate", ptr);
  Block* b = it->second;
  in_use_.erase(it);
  b->allocated = false;
  stats_.bytes_in_use -= b->size;

  FreeList& pool = free_list(b);
  if (b->prev != nullptr && !b->prev->allocated) {
    Block* prev = b->prev;
    pool.erase(prev);  // before its size (the set's key) changes
    prev->size += b->size;
    prev->next = b->next;
    if (b->next != nullptr) b->next->prev = prev;
    delete b;
    b = prev;
  }
  if (b->next != nullptr && !b->next->allocated) {
    Block* next = b->next;
    pool.erase(next);
    b->size += next->size;
    b->next = next->next;
    if (next->next != nullptr) next->next->prev = b;
    delete next;
  }
  pool.insert(b);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  AllocatorStats s = stats_;
  s.fragmentation = s.bytes_reserved == 0 ? 0.0
                                          : static_cast<double>(s.bytes_reserved - s.bytes_in_use) /
                                                static_cast<double>(s.bytes_reserved);
  return s;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use = stats_.bytes_in_use;
  stats_.peak_reserved = stats_.bytes_reserved;
}

void CachingAllocator::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  release_free_segments();
}

void CachingAllocator::release_free_segments() {
  for (FreeList* pool : {&small_free_, &large_free_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev != nullptr || b->next != nullptr) {  // part of a segment still in use
        ++it;
        continue;
      }
      memory_->release(b->ptr);
      stats_.bytes_reserved -= b->size;
      ++stats_.num_device_frees;
      it = pool->erase(it);
      delete b;
    }
  }
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t segment_bytes, bool small,
                                                       size_t requested) {
  // A request beyond the device's size cannot succeed; don't ask (or trim the cache) for it.
  if (segment_bytes > total_memory()) throw_out_of_memory(requested);
  void* p = memory_->allocate(segment_bytes);
  if (p == nullptr) {
    release_free_segments();
    p = memory_->allocate(segment_bytes);
  }
  if (p == nullptr) throw_out_of_memory(requested);

  Block* b = nullptr;
  try {
    b = new Block;
  } catch (...) {
    memory_->release(p);
    throw;
  }
  b->ptr = static_cast<char*>(p);
  b->size = segment_bytes;
  b->small = small;
  stats_.bytes_reserved += segment_bytes;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.bytes_reserved);
  ++stats_.num_device_allocs;
  return b;
}

// Cuts `b` (not in any free list) to `size` bytes; the rest becomes a free block after it.
void CachingAllocator::split(Block* b, size_t size) {
  Block* rest = new Block;
  rest->ptr = b->ptr + size;
  rest->size = b->size - size;
  rest->small = b->small;
  rest->prev = b;
  rest->next = b->next;
  if (b->next != nullptr) b->next->prev = rest;
  b->next = rest;
  b->size = size;
  free_list(rest).insert(rest);
}

size_t CachingAllocator::total_memory() {
  if (total_memory_ == 0) total_memory_ = memory_->mem_info().second;
  return total_memory_;
}

void CachingAllocator::throw_out_of_memory(size_t requested) {
  const auto [free_bytes, total_bytes] = memory_->mem_info();
  LLMK_FAIL(
      "out of GPU memory: requested {:.1f} MiB, {:.1f} MiB free of {:.1f} MiB (llmk holds {:.1f} "
      "MiB reserved, {:.1f} MiB in use)",
      mib(requested), mib(free_bytes), mib(total_bytes), mib(stats_.bytes_reserved),
      mib(stats_.bytes_in_use));
}

CachingAllocator& allocator() {
  static CachingAllocator* const instance = new CachingAllocator(cuda_device_memory());
  return *instance;
}

Tensor host_mapped_tensor(const Shape& shape, DType dtype, Tensor* host) {
  const auto bytes = static_cast<size_t>(bytes_for(dtype, shape_numel(shape)));
  void* p = nullptr;
  const cudaError_t err =
      cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocMapped | cudaHostAllocPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    LLMK_FAIL("cannot pin {:.1f} MiB of host memory for the GPU to read ({})", mib(bytes),
              cudaGetErrorString(err));
  }
  void* dev = nullptr;
  LLMK_CUDA_CHECK(cudaHostGetDevicePointer(&dev, p, 0));
  const std::shared_ptr<void> owner(p, [](void* q) { (void)cudaFreeHost(q); });
  if (host != nullptr) *host = Tensor::borrow(p, shape, dtype, Device::CPU, owner);
  return Tensor::borrow(dev, shape, dtype, Device::CUDA, owner);
}

void install_allocator() {
  set_device_allocator(Device::CUDA, [](size_t bytes) {
    CachingAllocator& a = allocator();
    return std::shared_ptr<void>(a.allocate(bytes), [&a](void* p) {
      try {
        a.deallocate(p);
      } catch (const std::exception& e) {  // a deleter must not throw
        std::fprintf(stderr, "llmk: %s\n", e.what());
        std::abort();
      }
    });
  });
}

}  // namespace llmk::cuda
