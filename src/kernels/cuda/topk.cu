// Top k of each row of logits, with the row's log-sum-exp; one block per row.
//
// Every float maps to an unsigned key whose integer order is the rank order (order_key, the same
// as cpu/topk.cpp's), so "the k largest" becomes "the k largest keys, lower id first among equal
// keys", found by a radix select on the keys, most significant byte first:
//   1. One pass over the row: its log-sum-exp (each thread keeps a running max and sum of exp,
//      merged in a fixed order, so the result is the same in every run) and a 256-bin histogram
//      of the keys' top bytes (shared-memory atomics: counts do not depend on their order).
//   2. From the histogram, the bin that holds the k-th largest key (pick_bin). The `above` keys
//      in the bins over it are all in the top k; `need` = k - above more come from the bin.
//      If the bin holds exactly `need` keys they are all in and the search stops (random logits
//      stop after the second or third byte, the k-th key alone in its bin); else one more pass
//      histograms the next byte of the keys in that bin, up to the fourth byte, where the bin is
//      a single key value shared by more than `need` elements: ties straddling the k-th place.
//      The top k are then the elements whose key, on the bytes chosen, is above the prefix found,
//      and the `need` lowest-id elements equal to it.
//   3. One pass collects them into shared memory. Where every element equal to the prefix is in
//      (the search stopped early), each selected element takes a slot from an atomic counter:
//      the set is fixed, and step 4 sorts it whatever order it landed in. Where ties must be cut,
//      they are ranked in id order instead: the row is walked in tiles of blockDim.x consecutive
//      elements, and each tie's rank is the count of ties before it, in earlier tiles and in lower
//      threads of its own (ballots and per-warp counts, block_rank), so the lowest ids win
//      however the threads are scheduled.
//   4. Each of the k entries goes to its place in the output: the number of entries that rank
//      before it (k^2 compares from shared memory, each a broadcast read; fine for k <= 1024).
//
// Cost per row of V floats: 4V bytes read 2 to 5 times (step 1, zero to three histogram passes,
// step 3; 3 or 4 for random logits), 8k bytes written, under 10 KB of static shared memory. At
// V = 262144 (1 MB a row) the rows in flight (two blocks per SM) overflow the L2, so the re-reads
// come from HBM. Step 1 costs more than a read (an exp per element), and step 4 adds k^2 / 1024
// compares per thread. Ties that must be cut (repeated values, -inf padding) make step 3 walk
// the row element by element with two __syncthreads per tile until `need` are found.
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/topk.h"

namespace llmk::cuda {

namespace {

constexpr int kMaxK = 1024;  // ops::kMaxTopk: the selected entries live in shared memory
constexpr int kMaxThreads = 1024;
constexpr int kDigitBits = 8;  // one byte of the key per radix pass
constexpr int kBins = 1 << kDigitBits;

// The key of cpu/topk.cpp: positive floats get the sign bit set (their bits already order like
// integers), negative ones have all bits flipped (they order backwards); -0.0 is taken as +0.0,
// every NaN as the largest key.
__device__ __forceinline__ uint32_t order_key(float x) {
  if (isnan(x)) return 0xFFFFFFFFu;
  const uint32_t bits = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// A selected element; 8 bytes, so step 4 reads one with one shared-memory load.
struct alignas(8) Entry {
  uint32_t key;
  int32_t id;
};

// The order of a row's top k: larger key first, then lower id.
__device__ __forceinline__ bool ranks_before(Entry a, Entry b) {
  return a.key > b.key || (a.key == b.key && a.id < b.id);
}

// The max and the sum of exp(x - max) over the finite logits seen; the sum in double.
struct MaxSum {
  float max;
  double sum;
};

__device__ __forceinline__ void add_finite(MaxSum& a, float x) {
  if (x > a.max) {
    a.sum = a.sum * expf(a.max - x) + 1.0;  // the first x: 0 * exp(-inf) + 1
    a.max = x;
  } else {
    a.sum += expf(x - a.max);
  }
}

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.0};  // neither has seen a finite logit
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// Every thread's MaxSum merged in a fixed order: a butterfly in each warp, then the warps in
// order. scratch: kWarp entries. Only thread 0's result is used.
__device__ MaxSum block_merge(MaxSum v, MaxSum* scratch) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    v = merge(
        v, MaxSum{__shfl_xor_sync(0xffffffffu, v.max, o), __shfl_xor_sync(0xffffffffu, v.sum, o)});
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < static_cast<int>(blockDim.x) / kWarp; ++w) v = merge(v, scratch[w]);
  return v;
}

// The log-sum-exp from the merged MaxSum and whether the row holds a NaN or a +inf, with
// cpu::topk_lse's rules for them.
__device__ __forceinline__ float finish_lse(MaxSum a, bool nan, bool pos_inf) {
  if (nan) return NAN;
  if (pos_inf) return INFINITY;
  if (a.max == -INFINITY) return -INFINITY;  // every logit is -inf
  return static_cast<float>(static_cast<double>(a.max) + log(a.sum));
}

// Calls f(x, i) for this thread's share of the row's N floats (x = row[i]), in 16-byte loads
// where kVec is 4 (the row 16-byte aligned); the order within and across threads is free.
template <int kVec, class F>
__device__ __forceinline__ void for_each_own(const float* row, int64_t N, F&& f) {
  int64_t tail = 0;  // where the element-by-element loop starts
  if constexpr (kVec == 4) {
    const int64_t nvec = N / 4;
    for (int64_t c = threadIdx.x; c < nvec; c += blockDim.x) {
      const float4 q = reinterpret_cast<const float4*>(row)[c];
      f(q.x, 4 * c);
      f(q.y, 4 * c + 1);
      f(q.z, 4 * c + 2);
      f(q.w, 4 * c + 3);
    }
    tail = nvec * 4;
  }
  for (int64_t i = tail + threadIdx.x; i < N; i += blockDim.x) f(row[i], i);
}

// Where the k-th largest key lies after a histogram pass.
struct Pick {
  int bin;    // the bin holding it
  int above;  // keys in the bins over it
};

// Called by warp 0: the bin of hist holding the need-th largest key (need >= 1, the histogram
// holds at least need keys). Lane l sums 8 bins from the top, 255 - 8l down to 248 - 8l; a scan
// over the lanes finds the first lane whose bins reach need, and that lane walks its 8 bins.
__device__ void pick_bin(const int* hist, int need, Pick* out) {
  constexpr int kPerLane = kBins / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int top = kBins - 1 - lane * kPerLane;
  int mine = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) mine += hist[top - j];
  int through = mine;  // keys in this lane's bins and all above them
#pragma unroll
  for (int o = 1; o < kWarp; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, through, o);
    if (lane >= o) through += v;
  }
  const unsigned reaches = __ballot_sync(0xffffffffu, through >= need);
  if (lane == __ffs(reaches) - 1) {
    int above = through - mine, bin = top;
    while (above + hist[bin] < need) above += hist[bin--];
    *out = Pick{bin, above};
  }
}

// For a flag per thread: the number of threads before this one (in thread order) with the flag
// set, and in *total the number in the block. Every thread of the block calls it. counts: kWarp
// ints.
__device__ __forceinline__ int block_rank(bool flag, int* counts, int* total) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) counts[warp] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << lane) - 1u)), sum = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x) / kWarp; ++w) {
    if (w < warp) before += counts[w];
    sum += counts[w];
  }
  *total = sum;
  __syncthreads();  // the next call rewrites counts
  return before;
}

// ids, values: [rows, k]; lse: [rows]; logits: [rows, N], rows ld apart. One block per row,
// blockDim.x a multiple of 32.
template <int kVec>
__global__ void __launch_bounds__(kMaxThreads)
    topk_lse_kernel(int32_t* ids, float* values, float* lse, const float* logits, int64_t ld,
                    int64_t N, int k, const float* lse_scale) {
  grid_dependency_wait();  // launch_dependent: the logits come from the kernel before
  __shared__ int hist[kBins];
  __shared__ Entry sel[kMaxK];  // the top k, in no order until step 4
  __shared__ MaxSum merge_scratch[kWarp];
  __shared__ int rank_scratch[kWarp];
  __shared__ Pick pick;
  __shared__ int n_slotted;  // entries of sel taken through the atomic counter
  const int64_t row = blockIdx.x;
  const float* x = logits + row * ld;

  // 1. The log-sum-exp and the histogram of the top bytes.
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) hist[b] = 0;
  if (threadIdx.x == 0) n_slotted = 0;
  __syncthreads();
  MaxSum acc{-INFINITY, 0.0};
  bool nan = false, pos_inf = false;
  const float scale = lse_scale != nullptr ? lse_scale[row] : 1.0f;
  for_each_own<kVec>(x, N, [&](float v, int64_t) {
    const float y = v * scale;  // (exactly v at scale 1)
    if (isfinite(y)) {
      add_finite(acc, y);
    } else {
      nan |= isnan(y);
      pos_inf |= y > 0.0f;
    }
    atomicAdd(&hist[order_key(v) >> (32 - kDigitBits)], 1);
  });
  acc = block_merge(acc, merge_scratch);
  nan = __syncthreads_or(nan);
  pos_inf = __syncthreads_or(pos_inf);
  if (threadIdx.x == 0) lse[row] = finish_lse(acc, nan, pos_inf);

  // 2. Radix select: the bytes of the k-th largest key, until its bin holds just what is needed.
  uint32_t prefix = 0, mask = 0;  // the bytes found so far; mask covers them
  int need = k;                   // elements of the top k whose key equals prefix on mask
  int in_bin = 0;                 // elements whose key equals prefix on mask
  for (int shift = 32 - kDigitBits;; shift -= kDigitBits) {
    __syncthreads();  // the histogram is complete
    if (threadIdx.x < kWarp) pick_bin(hist, need, &pick);
    __syncthreads();
    need -= pick.above;
    in_bin = hist[pick.bin];
    prefix |= static_cast<uint32_t>(pick.bin) << shift;
    mask |= static_cast<uint32_t>(kBins - 1) << shift;
    if (in_bin == need || shift == 0) break;
    __syncthreads();  // every thread has read the histogram and the pick
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const int next = shift - kDigitBits;
    for_each_own<kVec>(x, N, [&](float v, int64_t) {
      const uint32_t key = order_key(v);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> next) & (kBins - 1)], 1);
    });
  }

  // 3. Collect the top k: slots [0, k - need) for keys above the prefix, the rest for the ties.
  // Where every element equal to the prefix is in (the usual case), all take slots in any order;
  // else the ties are ranked in id order.
  const bool cut_ties = in_bin > need;
  const auto take = [&](uint32_t key, int64_t i) {
    sel[atomicAdd(&n_slotted, 1)] = Entry{key, static_cast<int32_t>(i)};
  };
  if (!cut_ties) {
    for_each_own<kVec>(x, N, [&](float v, int64_t i) {
      const uint32_t key = order_key(v);
      if ((key & mask) >= prefix) take(key, i);
    });
  } else {
    const int n_above = k - need;
    int ties_seen = 0;  // ties in the tiles before this one; the same in every thread
    for (int64_t base = 0; base < N; base += blockDim.x) {
      const int64_t i = base + threadIdx.x;
      uint32_t key = 0;
      bool tie = false;
      if (i < N) {
        key = order_key(x[i]);
        if ((key & mask) > prefix) take(key, i);
        tie = (key & mask) == prefix;
      }
      if (ties_seen < need) {  // uniform over the block, as block_rank requires
        int tile_ties = 0;
        const int rank = ties_seen + block_rank(tie, rank_scratch, &tile_ties);
        if (tie && rank < need) sel[n_above + rank] = Entry{key, static_cast<int32_t>(i)};
        ties_seen += tile_ties;
      }
    }
  }
  __syncthreads();

  // 4. Each entry's place in the output is the number of entries that rank before it.
  int32_t* row_ids = ids + row * k;
  float* row_values = values + row * k;
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    const Entry e = sel[j];
    int place = 0;
    for (int o = 0; o < k; ++o) place += ranks_before(sel[o], e);
    row_ids[place] = e.id;
    row_values[place] = x[e.id];  // the logit itself: the key lost -0.0 and NaN payloads
  }
}

// Throws llmk::Error for a broken precondition (through check.h: core/error.h does not build
// under nvcc).
[[noreturn]] void fail(const char* what) {
  throw_cuda_error(cudaErrorInvalidValue, what, __FILE__, __LINE__);
}

template <int kVec>
void launch(int32_t* ids, float* values, float* lse, const float* logits, int64_t rows,
            int64_t vocab, int64_t ld, int k, const float* lse_scale) {
  // Four elements per thread or more: short rows do not idle a big block.
  const int threads = block_threads_for(ceil_div(vocab, 4), kMaxThreads);
  launch_dependent(topk_lse_kernel<kVec>, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, ids,
                   values, lse, logits, ld, vocab, k, lse_scale);
}

}  // namespace

void topk_lse(int32_t* ids, float* values, float* lse, const float* logits, int64_t rows,
              int64_t vocab, int64_t ld, int k, const float* lse_scale) {
  if (rows == 0) return;
  if (k < 1 || k > kMaxK || k > vocab) fail("topk_lse: k must be in [1, min(vocab, 1024)]");
  if (vocab > INT_MAX || rows > INT_MAX) fail("topk_lse: rows and vocab must be below 2^31");
  const bool vec = is_aligned(logits, 16) && ld % 4 == 0;
  vec ? launch<4>(ids, values, lse, logits, rows, vocab, ld, k, lse_scale)
      : launch<1>(ids, values, lse, logits, rows, vocab, ld, k, lse_scale);
  check_launch("topk_lse");
}

}  // namespace llmk::cuda
