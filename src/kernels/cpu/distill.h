// Distillation losses from logits (llmk.ops.distill_loss), per row, forward and the gradient for
// the student's logits in one call: on the CPU in float or double with sums in double, the
// reference for the CUDA kernel (kernels/cuda/distill.h) and the path for CPU tensors.
//
// With T the temperature, q = softmax(student / T) and p = softmax(teacher / T) over a row of V:
//   KL          D = KL(p || q) = sum p (log p - log q)         (the teacher's distribution first)
//   ReverseKL   D = KL(q || p)
//   JSD(beta)   D = beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q; beta = 0
//               is taken as KL and beta = 1 as ReverseKL (where the mixture would make D vanish),
//               as Liger Kernel does.
// A row's loss is (1 - alpha) T^2 D + alpha CE, CE = -log softmax(student)[label] at temperature
// 1 (the hard label); T^2 keeps the soft term's gradients of one size across temperatures
// (Hinton et al.). A row whose label is ignore_index has loss 0 and gradient 0. Terms where a
// probability is exactly 0 (a logit of -inf, or underflow) add 0.
#pragma once

#include <cstdint>

namespace llmk::cpu::grad {

enum class Divergence : uint8_t { KL, ReverseKL, JSD };

struct DistillParams {
  Divergence kind = Divergence::KL;
  double beta = 0.5;         // JSD only, in [0, 1]
  double temperature = 1.0;  // > 0
  double alpha = 0.0;        // weight of the hard-label cross-entropy, in [0, 1]
  int64_t ignore_index = -100;
};

// The divergence a kind and beta compute (JSD at beta 0 or 1 is KL or ReverseKL).
inline Divergence effective_divergence(const DistillParams& p) {
  if (p.kind != Divergence::JSD) return p.kind;
  return p.beta == 0.0 ? Divergence::KL : p.beta == 1.0 ? Divergence::ReverseKL : Divergence::JSD;
}

// student, teacher: [rows, V], contiguous. labels: [rows] (null: every row counts, alpha must
// be 0). loss: [rows], each row's loss. grad (optional, [rows, V]): d loss[r] / d student[r]
// times grad_scale; grad may be student itself. A label outside [0, V) other than ignore_index
// throws llmk::Error.
template <class T>
void distill_rows(T* loss, T* grad, const T* student, const T* teacher, const int64_t* labels,
                  int64_t rows, int64_t V, const DistillParams& p, double grad_scale);

}  // namespace llmk::cpu::grad
