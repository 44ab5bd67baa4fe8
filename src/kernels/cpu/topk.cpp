#include "kernels/cpu/topk.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "kernels/cpu/vec_math.h"

namespace llmk::cpu {

namespace {

// A float as an unsigned key whose integer order is the order topk_lse ranks values in: the bits
// of a positive float already order like integers, so set its sign bit to put it above every
// negative one; a negative float orders backwards, so flip all its bits. -0.0 is taken as +0.0,
// and every NaN as the largest key. cuda/topk.cu uses the same key.
uint32_t order_key(float x) {
  if (std::isnan(x)) return 0xFFFFFFFFu;
  const uint32_t bits = std::bit_cast<uint32_t>(x == 0.0f ? 0.0f : x);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

struct Entry {
  uint32_t key;
  int32_t id;
};

// The order of a row's top k: larger key first, then lower id.
bool ranks_before(const Entry& a, const Entry& b) {
  return a.key > b.key || (a.key == b.key && a.id < b.id);
}

// The first k entries of x[0, n) in rank order, into out[0, k). A heap keeps the best k seen so
// far with the worst of them on top; most elements of a long row lose to it at one compare.
void top_k_row(int32_t* ids, float* values, const float* x, int64_t n, int k,
               std::vector<Entry>& heap) {
  heap.clear();
  for (int64_t i = 0; i < n; ++i) {
    const Entry e{order_key(x[i]), static_cast<int32_t>(i)};
    if (static_cast<int>(heap.size()) < k) {
      heap.push_back(e);
      std::push_heap(heap.begin(), heap.end(), ranks_before);
    } else if (e.key > heap.front().key) {  // an equal key ranks after: its id is higher
      std::pop_heap(heap.begin(), heap.end(), ranks_before);
      heap.back() = e;
      std::push_heap(heap.begin(), heap.end(), ranks_before);
    }
  }
  std::sort_heap(heap.begin(), heap.end(), ranks_before);  // best first
  for (int j = 0; j < k; ++j) {
    ids[j] = heap[static_cast<size_t>(j)].id;
    values[j] = x[heap[static_cast<size_t>(j)].id];
  }
}

// Of x[i] * scale (each product a float: x[i] itself at scale 1).
float log_sum_exp(const float* x, int64_t n, float scale) {
  float max = -INFINITY;
  bool nan = false, pos_inf = false;
  for (int64_t i = 0; i < n; ++i) {
    const float y = x[i] * scale;
    if (std::isfinite(y)) {
      max = std::max(max, y);
    } else {
      nan |= std::isnan(y);
      pos_inf |= y > 0;
    }
  }
  if (nan) return NAN;
  if (pos_inf) return INFINITY;
  if (max == -INFINITY) return -INFINITY;  // every logit is -inf
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += std::exp(static_cast<double>(x[i] * scale) - max);  // -inf: 0
  }
  return static_cast<float>(max + std::log(sum));
}

}  // namespace

void topk_lse(int32_t* ids, float* values, float* lse, const float* logits, int64_t rows,
              int64_t vocab, int64_t ld, int k, const float* lse_scale) {
  detail::parallel_rows(rows, vocab, [&](int64_t r0, int64_t r1) {
    std::vector<Entry> heap;
    heap.reserve(static_cast<size_t>(k));
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = logits + r * ld;
      top_k_row(ids + r * k, values + r * k, x, vocab, k, heap);
      lse[r] = log_sum_exp(x, vocab, lse_scale != nullptr ? lse_scale[r] : 1.0f);
    }
  });
}

}  // namespace llmk::cpu
