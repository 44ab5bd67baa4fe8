#include "kernels/cuda/gemm/linear.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"
#include "core/error.h"
#include "kernels/cuda/gemm/bias.h"
#include "kernels/cuda/gemm/gemv.h"
#include "kernels/cuda/gemm/qlinear.h"

namespace llmk::cuda {

namespace {

// "M=7 N=896 K=896 (x bf16 ld 896, w bf16 ld 896, out f32 ld 896, bias bf16)"
std::string describe(const LinearArgs& a) {
  const std::string_view in = dtype_name(a.in_dtype);
  return fmt::format("M={} N={} K={} (x {}{} ld {}, w {}{} ld {}, out {} ld {}, bias {})", a.M, a.N,
                     a.K, in, a.x_trans ? " transposed" : "", a.ldx, in,
                     a.w_trans ? " transposed" : "", a.ldw, dtype_name(a.out_dtype), a.ldo,
                     a.bias ? dtype_name(a.bias_dtype) : std::string_view("none")) +
         (a.gelu ? (a.aux ? ", GELU epilogue with aux" : ", GELU epilogue") : "") +
         (a.accumulate ? ", added to out" : "");
}

[[noreturn]] void throw_status(cublasStatus_t s, std::string_view call, std::string_view what) {
  LLMK_FAIL("cuda::linear: {} failed: {} ({}) for {}", call, cublasLtGetStatusName(s),
            cublasLtGetStatusString(s), what);
}

void check_status(cublasStatus_t s, std::string_view call, const LinearArgs& a) {
  if (s != CUBLAS_STATUS_SUCCESS) throw_status(s, call, describe(a));
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F16:
      return CUDA_R_16F;
    case DType::F32:
      return CUDA_R_32F;
    default:
      LLMK_FAIL("cuda::linear: dtype {} is not supported (bf16, f16 or f32)", dtype_name(t));
  }
}

// Largest power of two, up to 256, that divides the address: cuBLASLt's heuristic assumes 256
// unless told, and a kernel that needs more alignment than a pointer has reads wrong addresses.
uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return v == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(256, v & (~v + 1)));
}

// The epilogue reads the bias with vector loads; a bias not 16-byte aligned takes the kernel.
constexpr uint32_t kBiasEpilogueAlignment = 16;

void add_bias(const LinearArgs& a, bool assign, cudaStream_t stream) {
  LLMK_CHECK(
      add_bias_rows(a.out, a.out_dtype, a.ldo, a.bias, a.bias_dtype, a.M, a.N, assign, stream),
      "cuda::linear: no bias kernel for {}", describe(a));
}

template <typename T, auto Destroy>
struct LtDeleter {
  void operator()(T* p) const { (void)Destroy(p); }
};
using MatmulDesc = std::unique_ptr<
    std::remove_pointer_t<cublasLtMatmulDesc_t>,
    LtDeleter<std::remove_pointer_t<cublasLtMatmulDesc_t>, cublasLtMatmulDescDestroy>>;
using Layout = std::unique_ptr<
    std::remove_pointer_t<cublasLtMatrixLayout_t>,
    LtDeleter<std::remove_pointer_t<cublasLtMatrixLayout_t>, cublasLtMatrixLayoutDestroy>>;
using Preference = std::unique_ptr<
    std::remove_pointer_t<cublasLtMatmulPreference_t>,
    LtDeleter<std::remove_pointer_t<cublasLtMatmulPreference_t>, cublasLtMatmulPreferenceDestroy>>;

struct Counters {
  std::atomic<uint64_t> calls{0}, plans{0}, tuned{0}, bias_epilogue{0}, bias_kernel{0}, gemv{0},
      gelu_epilogue{0}, qgemv{0}, qgemm{0}, qbands{0};
};
std::atomic<bool> g_gemv{true};
std::atomic<bool> g_tune{true};
// Tuning: the first plan of at least kTuneMinRows rows in a bucket (M rounded up to a power of
// two, other fields equal) times up to kTuneCandidates of the heuristic's algorithms (Lt::fastest).
constexpr int64_t kTuneMinRows = 64;
constexpr int kTuneCandidates = 8;
constexpr int kTuneRounds = 7;
// The write that evicts the L2 before each timed run: twice this GPU's L2 (100 MiB on an H100),
// held only while tuning, but at the peak of a long prompt's first prefill.
size_t flush_bytes() {
  static const size_t bytes = std::max(2 * device_info().l2_bytes, size_t{32} << 20);
  return bytes;
}
// LLMK_LOG_TUNING=1 in the environment: each tuning prints its candidates' times to stderr.
const bool g_tune_log = [] {
  const char* v = std::getenv("LLMK_LOG_TUNING");
  return v && *v && std::string_view(v) != "0";
}();

// "tile 18 stages 9 splitk 1" for the log: the algorithm's configuration as cuBLASLt numbers it
// (cublasLtMatmulTile_t, cublasLtMatmulStages_t).
std::string tile_name(const cublasLtMatmulAlgo_t& algo) {
  uint32_t tile = 0, stages = 0;
  int32_t splitk = 0;
  size_t size = 0;
  (void)cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                             sizeof tile, &size);
  (void)cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                             sizeof stages, &size);
  (void)cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                             sizeof splitk, &size);
  return fmt::format("t{}/s{}/k{}", tile, stages, splitk);
}
Counters& counters() {
  static Counters c;
  return c;
}

// Everything the chosen algorithm depends on. Pointers enter only through their alignment.
struct PlanKey {
  int64_t M, N, K, ldx, ldw, ldo;
  bool x_trans, w_trans;
  DType in_dtype, out_dtype;
  bool bias;
  DType bias_dtype;  // (F32 without a bias)
  bool bias_aligned;
  uint32_t align_x, align_w, align_out;
  bool gelu, aux;
  int64_t ld_aux;
  uint32_t align_aux;
  bool invariant;  // LinearArgs::batch_invariant
  auto operator<=>(const PlanKey&) const = default;
};

struct Plan {
  MatmulDesc desc;
  Layout w_layout, x_layout, out_layout;
  cublasLtMatmulAlgo_t algo{};
  bool bias_in_epilogue = false;
  bool none = false;  // a GELU epilogue was asked for and cuBLASLt has no algorithm for it
};

template <typename T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v,
              const LinearArgs& a) {
  check_status(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v),
               "cublasLtMatmulDescSetAttribute", a);
}

template <typename T>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& v,
              const LinearArgs& a) {
  check_status(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof v),
               "cublasLtMatmulPreferenceSetAttribute", a);
}

Layout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                   const LinearArgs& a) {
  cublasLtMatrixLayout_t l = nullptr;
  check_status(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows),
                                          static_cast<uint64_t>(cols), ld),
               "cublasLtMatrixLayoutCreate", a);
  return Layout(l);
}

// A stream's own buffer of `bytes`, allocated once (the callers keep it for good); throws,
// naming `who` and `what`, inside CUDA graph capture, where allocating is not allowed.
void* allocate_for_stream(cudaStream_t stream, size_t bytes, const char* who, const char* what) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LLMK_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  LLMK_CHECK(capture == cudaStreamCaptureStatusNone,
             "{} is inside CUDA graph capture, but it allocates the stream's {} MiB {}", who,
             bytes >> 20, what);
  return allocator().allocate(bytes);
}

// The process-wide cuBLASLt state. Never destroyed: the handle and the workspace must outlive
// tensors and graphs released during static destruction.
class Lt {
 public:
  static Lt& get() {
    static Lt* const lt = new Lt();
    return *lt;
  }

  // False, with nothing enqueued, for a GELU epilogue cuBLASLt has no algorithm for.
  bool run(const LinearArgs& a);

 private:
  Lt() {
    const cublasStatus_t s = cublasLtCreate(&handle_);
    if (s != CUBLAS_STATUS_SUCCESS) throw_status(s, "cublasLtCreate", "the process-wide handle");
  }

  // The stream's workspace (under mu_), allocated at the stream's first call: calls on
  // different streams may run at once and must not share one.
  void* workspace(cudaStream_t stream) {
    if (const auto it = workspaces_.find(stream); it != workspaces_.end()) return it->second;
    void* w = allocate_for_stream(stream, kLinearWorkspaceBytes,
                                  "cuda::linear: the first call on a stream",
                                  "workspace; run one linear on it outside capture first");
    workspaces_.emplace(stream, w);
    return w;
  }

  const Plan& plan(const PlanKey& key, const LinearArgs& a);
  // The heuristic's algorithms for a (at most `max`; with single_pass_only, those without
  // split-K), with p.desc and p.bias_in_epilogue set to match them. Empty for a GELU epilogue
  // cuBLASLt has none for.
  std::vector<cublasLtMatmulAlgo_t> search(Plan& p, const PlanKey& key, const LinearArgs& a,
                                           int max, bool single_pass_only);
  // LinearArgs::batch_invariant: the algorithm chosen for the problem without M (tuned_'s
  // sibling invariant_), checked to run at a.M.
  Plan invariant_plan(const PlanKey& key, const LinearArgs& a);
  std::vector<cublasLtMatmulAlgo_t> candidates(const Plan& p, const PlanKey& key,
                                               const LinearArgs& a, bool lenient, int max);
  bool accepts(const Plan& p, const cublasLtMatmulAlgo_t& algo) const;
  // Sets the call's bias and aux pointers on the plan's (shared) descriptor, under mu_.
  void bind(const Plan& p, const LinearArgs& a) {
    if (p.bias_in_epilogue) set_desc(p.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, a.bias, a);
    if (a.gelu && a.aux)
      set_desc(p.desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, a.aux, a);
  }
  size_t fastest(const Plan& p, const std::vector<cublasLtMatmulAlgo_t>& algos,
                 const LinearArgs& a);

  std::mutex mu_;  // guards plans_ and the bias pointer set on a shared descriptor
  cublasLtHandle_t handle_ = nullptr;
  std::map<cudaStream_t, void*> workspaces_;
  std::vector<cudaEvent_t> events_;  // for tuning; created on first use
  std::map<PlanKey, Plan> plans_;
  // Tuned choices by problem with M rounded up to a power of two (a bucket).
  struct Tuned {
    cublasLtMatmulAlgo_t algo;
    bool bias_in_epilogue;
  };
  std::map<PlanKey, Tuned> tuned_;
  std::map<PlanKey, Tuned> invariant_;  // by problem with M = 0
};

// Asks the heuristic for its best algorithms under the plan's descriptor, best first (at most
// `max`); empty when it has none. `lenient`: a descriptor the heuristic calls invalid also gives
// none (else that throws).
std::vector<cublasLtMatmulAlgo_t> Lt::candidates(const Plan& p, const PlanKey& key,
                                                 const LinearArgs& a, bool lenient, int max) {
  cublasLtMatmulPreference_t raw = nullptr;
  check_status(cublasLtMatmulPreferenceCreate(&raw), "cublasLtMatmulPreferenceCreate", a);
  const Preference pref(raw);
  set_pref(raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kLinearWorkspaceBytes}, a);
  set_pref(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_w, a);
  set_pref(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_x, a);
  set_pref(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_out, a);
  set_pref(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_out, a);
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(max));
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
      handle_, p.desc.get(), p.w_layout.get(), p.x_layout.get(), p.out_layout.get(),
      p.out_layout.get(), raw, max, results.data(), &found);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || (lenient && s == CUBLAS_STATUS_INVALID_VALUE)) {
    return {};
  }
  check_status(s, "cublasLtMatmulAlgoGetHeuristic", a);
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < found; ++i) {
    if (results[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS) {
      algos.push_back(results[static_cast<size_t>(i)].algo);
    }
  }
  return algos;
}

// Whether the current stream is being captured into a CUDA graph (tuning synchronises).
bool capturing() {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LLMK_CUDA_CHECK(cudaStreamIsCapturing(current_stream(), &capture));
  return capture != cudaStreamCaptureStatusNone;
}

// While it lives, this thread's synchronisations are outside any other thread's graph capture
// (cudaStreamCaptureModeRelaxed): tuning synchronises.
class RelaxedCapture {
 public:
  RelaxedCapture() { LLMK_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// A scratch matrix of out's layout for timed runs of a call that adds to out (which holds what
// it adds to); none (null) for a call that overwrites out, whose runs write out itself.
std::unique_ptr<void, void (*)(void*)> timing_scratch(bool accumulate, int64_t M, int64_t ldo,
                                                      int64_t N, DType out_dtype) {
  const size_t bytes = static_cast<size_t>((M - 1) * ldo + N) * element_size(out_dtype);
  return {accumulate ? allocator().allocate(bytes) : nullptr, [](void* q) {
            if (q) allocator().deallocate(q);
          }};
}

// The median time in ms of each of n candidates on the current stream: kTuneRounds rounds, each
// a write of flush_bytes() that evicts the L2 and then one run(c) of every candidate, the order
// rotated every round; each run between its own pair of events (`events`: created on first
// use), all read after one synchronisation.
std::vector<float> timed_medians(size_t n, std::vector<cudaEvent_t>& events,
                                 const std::function<void(size_t)>& run) {
  const cudaStream_t stream = current_stream();
  const size_t need = 2 * n * kTuneRounds;
  while (events.size() < need) {
    events.push_back(nullptr);
    LLMK_CUDA_CHECK(cudaEventCreate(&events.back()));
  }
  const size_t flush_size = flush_bytes();
  const std::unique_ptr<void, void (*)(void*)> flush(allocator().allocate(flush_size),
                                                     [](void* q) { allocator().deallocate(q); });
  for (int r = 0; r < kTuneRounds; ++r) {
    for (size_t j = 0; j < n; ++j) {
      const size_t c = (j + static_cast<size_t>(r)) % n, e = 2 * (static_cast<size_t>(r) * n + c);
      LLMK_CUDA_CHECK(cudaMemsetAsync(flush.get(), r + 1, flush_size, stream));
      LLMK_CUDA_CHECK(cudaEventRecord(events[e], stream));
      run(c);
      LLMK_CUDA_CHECK(cudaEventRecord(events[e + 1], stream));
    }
  }
  LLMK_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> medians(n), ms(kTuneRounds);
  for (size_t c = 0; c < n; ++c) {
    for (int r = 0; r < kTuneRounds; ++r) {
      const size_t e = 2 * (static_cast<size_t>(r) * n + c);
      LLMK_CUDA_CHECK(cudaEventElapsedTime(&ms[static_cast<size_t>(r)], events[e], events[e + 1]));
    }
    std::nth_element(ms.begin(), ms.begin() + kTuneRounds / 2, ms.end());
    medians[c] = ms[kTuneRounds / 2];
  }
  return medians;
}

// Whether cuBLASLt runs `algo` under the plan's descriptor and layouts within the workspace.
bool Lt::accepts(const Plan& p, const cublasLtMatmulAlgo_t& algo) const {
  cublasLtMatmulHeuristicResult_t r{};
  const cublasStatus_t s =
      cublasLtMatmulAlgoCheck(handle_, p.desc.get(), p.w_layout.get(), p.x_layout.get(),
                              p.out_layout.get(), p.out_layout.get(), &algo, &r);
  return s == CUBLAS_STATUS_SUCCESS && r.state == CUBLAS_STATUS_SUCCESS &&
         r.workspaceSize <= kLinearWorkspaceBytes;
}

// Index of the fastest of `algos` on the call's own operands, timed as a model's forward meets
// them: the weights cold (not in the L2), as each layer's are there. Each candidate runs once
// first (one that fails there is skipped; this also brings the clocks up from idle), then
// kTuneRounds rounds time one call of each after a write of flush_bytes() that evicts the L2, the
// order rotated every round; the lowest median wins. (Timed back to back, with the weights partly
// in the L2, the choices ran slower in a model's forward.) The runs write out, which the call
// itself overwrites next (or a scratch matrix, for a call that adds to out).
size_t Lt::fastest(const Plan& p, const std::vector<cublasLtMatmulAlgo_t>& algos,
                   const LinearArgs& a) {
  const cudaStream_t stream = current_stream();
  const RelaxedCapture relaxed;
  bind(p, a);
  // The timed runs write over their output: an accumulating call's runs write a scratch matrix
  // instead (beta = 0 there too: cuBLASLt's algorithms do not depend on beta).
  const auto scratch = timing_scratch(a.accumulate, a.M, a.ldo, a.N, a.out_dtype);
  void* const out = a.accumulate ? scratch.get() : a.out;
  const float alpha = 1.0f, beta = 0.0f;
  const auto matmul = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle_, p.desc.get(), &alpha, a.w, p.w_layout.get(), a.x,
                          p.x_layout.get(), &beta, out, p.out_layout.get(), out, p.out_layout.get(),
                          &algo, workspace(stream), kLinearWorkspaceBytes, stream);
  };
  ++counters().tuned;
  std::vector<size_t> ok;  // the candidates that ran
  for (size_t i = 0; i < algos.size() && ok.size() < kTuneCandidates; ++i) {
    if (matmul(algos[i]) == CUBLAS_STATUS_SUCCESS) ok.push_back(i);
  }
  if (ok.size() <= 1) return ok.empty() ? 0 : ok[0];
  const std::vector<float> medians =
      timed_medians(ok.size(), events_, [&](size_t c) { (void)matmul(algos[ok[c]]); });
  size_t best = ok[0];
  float best_ms = std::numeric_limits<float>::infinity();
  std::string log;
  for (size_t c = 0; c < ok.size(); ++c) {
    const float median = medians[c];
    if (median < best_ms) {
      best_ms = median;
      best = ok[c];
    }
    if (g_tune_log) log += fmt::format(" {}:{:.1f}", tile_name(algos[ok[c]]), 1e3f * median);
  }
  if (g_tune_log) {
    fmt::print(stderr, "llmk: linear tuning {}: {} chosen; us per call:{}\n", describe(a),
               tile_name(algos[best]), log);
  }
  return best;
}

// A matmul descriptor for out^T [N, M] = op(A) @ op(B) in column-major terms, with A = w and
// B = x: w row-major [N, K] is column-major [K, N], taken transposed (w_trans: stored [K, N],
// column-major [N, K], taken as is); x row-major [M, K] is column-major [K, M], taken as is
// (x_trans: column-major [M, K], taken transposed). With the bias epilogue when asked (its bias
// has the output's dtype: cuBLASLt's default), and GELU (a.gelu; its input also written to aux
// when a.aux is set) in the epilogue.
MatmulDesc make_desc(bool bias_epilogue, const LinearArgs& a) {
  cublasLtMatmulDesc_t raw = nullptr;
  check_status(cublasLtMatmulDescCreate(&raw, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate", a);
  MatmulDesc desc(raw);
  set_desc(raw, CUBLASLT_MATMUL_DESC_TRANSA,
           static_cast<int32_t>(a.w_trans ? CUBLAS_OP_N : CUBLAS_OP_T), a);
  set_desc(raw, CUBLASLT_MATMUL_DESC_TRANSB,
           static_cast<int32_t>(a.x_trans ? CUBLAS_OP_T : CUBLAS_OP_N), a);
  cublasLtEpilogue_t epi = bias_epilogue ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (a.gelu && a.aux) {
    epi = bias_epilogue ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    set_desc(raw, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, a.ld_aux, a);
  } else if (a.gelu) {
    epi = bias_epilogue ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  }
  if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
    set_desc(raw, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(epi), a);
  }
  return desc;
}

// The plan's layouts for a's operands.
void set_layouts(Plan& p, const LinearArgs& a) {
  const cudaDataType_t in = cuda_type(a.in_dtype);
  p.w_layout =
      a.w_trans ? make_layout(in, a.N, a.K, a.ldw, a) : make_layout(in, a.K, a.N, a.ldw, a);
  p.x_layout =
      a.x_trans ? make_layout(in, a.M, a.K, a.ldx, a) : make_layout(in, a.K, a.M, a.ldx, a);
  p.out_layout = make_layout(cuda_type(a.out_dtype), a.N, a.M, a.ldo, a);
}

// Whether `algo` reduces over K in one pass (no split-K): each output element's sum is then
// formed in one order whatever the other rows.
bool single_pass(const cublasLtMatmulAlgo_t& algo) {
  int32_t splitk = 1;
  size_t size = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                           sizeof splitk, &size) != CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  return splitk <= 1;
}

// The row count the batch-invariant algorithm is chosen for (a prompt chunk's order of size).
constexpr int64_t kInvariantRows = 256;

std::vector<cublasLtMatmulAlgo_t> Lt::search(Plan& p, const PlanKey& key, const LinearArgs& a,
                                             int max, bool single_pass_only) {
  const auto ask = [&](bool bias_epilogue, bool lenient) {
    p.desc = make_desc(bias_epilogue, a);
    p.bias_in_epilogue = bias_epilogue;
    std::vector<cublasLtMatmulAlgo_t> algos = candidates(p, key, a, lenient, max);
    if (single_pass_only) std::erase_if(algos, [](const auto& x) { return !single_pass(x); });
    return algos;
  };
  // The bias goes in the epilogue when it has the output's dtype, the only bias dtype cuBLASLt
  // documents for these outputs (asking for another through BIAS_DATA_TYPE makes the heuristic
  // answer CUBLAS_STATUS_INVALID_VALUE on cuBLASLt 13 / H100). Any other bias, an under-aligned
  // one, or one whose epilogue the heuristic rejects, is added by a separate kernel.
  const bool bias_epilogue = key.bias && key.bias_dtype == key.out_dtype && key.bias_aligned;
  if (a.gelu) {  // the bias must be added before the activation: in the epilogue, or not at all
    if (key.bias && !bias_epilogue) return {};
    return ask(key.bias, /*lenient=*/true);
  }
  if (bias_epilogue) {
    std::vector<cublasLtMatmulAlgo_t> algos = ask(true, /*lenient=*/true);
    if (!algos.empty()) return algos;
  }
  return ask(false, /*lenient=*/false);
}

Plan Lt::invariant_plan(const PlanKey& key, const LinearArgs& a) {
  LLMK_CHECK(!a.x_trans, "cuda::linear: batch invariance takes x untransposed, in {}", describe(a));
  PlanKey canon = key;
  canon.M = 0;
  auto it = invariant_.find(canon);
  if (it == invariant_.end()) {
    // The heuristic asked at kInvariantRows rows, whatever M this first call has, so that the
    // choice does not depend on which call comes first; its first single-pass candidate.
    LinearArgs c = a;
    c.M = kInvariantRows;
    c.ldx = std::max(c.ldx, c.K);
    c.ldo = std::max(c.ldo, c.N);
    Plan q;
    set_layouts(q, c);
    const std::vector<cublasLtMatmulAlgo_t> algos = search(q, key, c, kTuneCandidates, true);
    LLMK_CHECK(!algos.empty(),
               "cuda::linear: cuBLASLt has no single-pass algorithm for {} (batch invariance)",
               describe(a));
    it = invariant_.emplace(canon, Tuned{algos[0], q.bias_in_epilogue}).first;
  }
  Plan p;
  set_layouts(p, a);
  p.desc = make_desc(it->second.bias_in_epilogue, a);
  p.algo = it->second.algo;
  p.bias_in_epilogue = it->second.bias_in_epilogue;
  LLMK_CHECK(accepts(p, p.algo), "cuda::linear: the batch-invariant algorithm ({}) does not run {}",
             tile_name(p.algo), describe(a));
  ++counters().plans;
  return p;
}

const Plan& Lt::plan(const PlanKey& key, const LinearArgs& a) {
  if (const auto it = plans_.find(key); it != plans_.end()) return it->second;
  if (a.batch_invariant) return plans_.emplace(key, invariant_plan(key, a)).first->second;

  Plan p;
  set_layouts(p, a);
  // Tuning: a bucket's first problem met outside capture times the candidates; the bucket's
  // later problems take its choice where cuBLASLt accepts it for their shape.
  const bool tunable = g_tune.load(std::memory_order_relaxed) && a.M >= kTuneMinRows;
  PlanKey bucket = key;
  bucket.M = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(a.M)));
  if (tunable) {
    if (const auto it = tuned_.find(bucket); it != tuned_.end()) {
      p.desc = make_desc(it->second.bias_in_epilogue, a);
      if (accepts(p, it->second.algo)) {
        p.algo = it->second.algo;
        p.bias_in_epilogue = it->second.bias_in_epilogue;
        ++counters().plans;
        return plans_.emplace(key, std::move(p)).first->second;
      }
    }
  }
  const bool tune = tunable && !capturing();
  const int max = tune ? kTuneCandidates : 1;
  const std::vector<cublasLtMatmulAlgo_t> algos = search(p, key, a, max, false);
  if (algos.empty() && a.gelu) {
    p.none = true;
    return plans_.emplace(key, std::move(p)).first->second;
  }
  LLMK_CHECK(!algos.empty(),
             "cuda::linear: cuBLASLt has no algorithm for {} (pointer alignments x {} B, w {} B, "
             "out {} B)",
             describe(a), key.align_x, key.align_w, key.align_out);
  p.algo = algos[tune && algos.size() > 1 ? fastest(p, algos, a) : 0];
  if (tune) tuned_.emplace(bucket, Tuned{p.algo, p.bias_in_epilogue});
  ++counters().plans;
  return plans_.emplace(key, std::move(p)).first->second;
}

bool Lt::run(const LinearArgs& a) {
  const PlanKey key{a.M,
                    a.N,
                    a.K,
                    a.ldx,
                    a.ldw,
                    a.ldo,
                    a.x_trans,
                    a.w_trans,
                    a.in_dtype,
                    a.out_dtype,
                    a.bias != nullptr,
                    a.bias ? a.bias_dtype : DType::F32,
                    alignment(a.bias) >= kBiasEpilogueAlignment,
                    alignment(a.x),
                    alignment(a.w),
                    alignment(a.out),
                    a.gelu,
                    a.aux != nullptr,
                    a.aux ? a.ld_aux : 0,
                    a.aux ? alignment(a.aux) : 0u,
                    a.batch_invariant};
  const cudaStream_t stream = current_stream();
  bool bias_kernel = false;
  {
    std::lock_guard lock(mu_);
    const Plan& p = plan(key, a);
    if (p.none) return false;
    bind(p, a);
    if (a.gelu) ++counters().gelu_epilogue;
    if (p.bias_in_epilogue) {
      ++counters().bias_epilogue;
    } else if (a.bias) {
      bias_kernel = true;
      ++counters().bias_kernel;
    }
    // beta = 0: out is not read (it may hold NaN); 1: the product is added to it in the
    // epilogue (D = C = out, in place: one layout for both).
    const float alpha = 1.0f, beta = a.accumulate ? 1.0f : 0.0f;
    check_status(
        cublasLtMatmul(handle_, p.desc.get(), &alpha, a.w, p.w_layout.get(), a.x, p.x_layout.get(),
                       &beta, a.out, p.out_layout.get(), a.out, p.out_layout.get(), &p.algo,
                       workspace(stream), kLinearWorkspaceBytes, stream),
        "cublasLtMatmul", a);
    ++counters().calls;
  }
  if (bias_kernel) add_bias(a, false, stream);
  return true;
}

void check_args(const LinearArgs& a) {
  LLMK_CHECK(a.M >= 0 && a.N >= 0 && a.K >= 0, "cuda::linear: negative size in {}", describe(a));
  LLMK_CHECK(is_float_type(a.in_dtype), "cuda::linear: x and w must be bf16, f16 or f32 in {}",
             describe(a));
  LLMK_CHECK(is_float_type(a.out_dtype), "cuda::linear: out must be bf16, f16 or f32 in {}",
             describe(a));
  LLMK_CHECK(!a.bias || is_float_type(a.bias_dtype),
             "cuda::linear: bias must be bf16, f16 or f32 in {}", describe(a));
  LLMK_CHECK(a.ldx >= (a.x_trans ? a.M : a.K) && a.ldw >= (a.w_trans ? a.N : a.K) && a.ldo >= a.N,
             "cuda::linear: a leading dimension is shorter than its row in {}", describe(a));
  LLMK_CHECK(!(a.accumulate && a.gelu), "cuda::linear: a GELU epilogue does not add to out, in {}",
             describe(a));
}

// The one-row kernel (gemv.h) for a, where M = 1, the kernel is on and takes the operands.
bool run_one_row(const LinearArgs& a, bool gated, Activation act, const GemvRope* rope = nullptr) {
  if (a.M != 1 || a.x_trans || a.w_trans || a.accumulate || a.in_dtype == DType::F32 ||
      a.batch_invariant || !g_gemv.load(std::memory_order_relaxed)) {
    return false;
  }
  const GemvArgs g{.out = a.out,
                   .out_dtype = a.out_dtype,
                   .in_dtype = a.in_dtype,
                   .x = a.x,
                   .w = a.w,
                   .ldw = a.ldw,
                   .bias = a.bias,
                   .bias_dtype = a.bias_dtype,
                   .N = a.N,
                   .K = a.K,
                   .gated = gated,
                   .act = act,
                   .rope = rope};
  if (!gemv_applies(g)) return false;
  LLMK_CHECK(gemv(g), "cuda::linear: no one-row kernel for {}", describe(a));
  ++counters().calls;
  ++counters().gemv;
  return true;
}

}  // namespace

void linear(const LinearArgs& args) {
  LinearArgs a = args;
  // A single row has no row stride to speak of: normalise it so that views with any stride share
  // one plan, and cuBLASLt sees a valid leading dimension.
  if (a.M <= 1) {
    if (!a.x_trans) a.ldx = a.K;
    a.ldo = a.N;
  }
  if (a.N <= 1 && !a.w_trans) a.ldw = a.K;
  check_args(a);
  if (a.M == 0 || a.N == 0) return;
  a.ldx = std::max<int64_t>(a.ldx, 1);
  a.ldw = std::max<int64_t>(a.ldw, 1);
  if (a.K == 0) {  // an empty sum: out = bias, or zeros (out += bias, or nothing)
    if (a.bias) {
      add_bias(a, !a.accumulate, current_stream());
    } else if (!a.accumulate) {
      const size_t es = element_size(a.out_dtype);
      LLMK_CUDA_CHECK(cudaMemset2DAsync(a.out, static_cast<size_t>(a.ldo) * es, 0,
                                        static_cast<size_t>(a.N) * es, static_cast<size_t>(a.M),
                                        current_stream()));
    }
    return;
  }
  LLMK_CHECK(!a.gelu, "cuda::linear: a GELU epilogue goes through linear_gelu, in {}", describe(a));
  if (run_one_row(a, false, Activation::SiLU)) return;
  (void)Lt::get().run(a);  // no epilogue asked: always runs
}

bool linear_gelu(const LinearArgs& args) {
  LinearArgs a = args;
  LLMK_CHECK(a.gelu, "cuda::linear_gelu: a.gelu is not set in {}", describe(a));
  if (a.M <= 1) {
    if (!a.x_trans) a.ldx = a.K;
    a.ldo = a.N;
    if (a.aux) a.ld_aux = a.N;
  }
  check_args(a);
  LLMK_CHECK(!a.aux || a.ld_aux >= a.N, "cuda::linear_gelu: ld_aux {} is shorter than a row in {}",
             a.ld_aux, describe(a));
  if (a.M == 0 || a.N == 0) return true;
  // cuBLASLt's aux: a leading dimension of a multiple of 8 and a 16-byte aligned pointer.
  if (a.K == 0 || (a.aux && (a.ld_aux % 8 != 0 || alignment(a.aux) < 16))) return false;
  return Lt::get().run(a);
}

bool linear_gated_row(const LinearArgs& a, Activation act) {
  return a.K > 0 && run_one_row(a, true, act);
}

bool linear_rope_row(const LinearArgs& a, const GemvRope& rope) {
  return a.K > 0 && run_one_row(a, false, Activation::SiLU, &rope);
}

namespace {

// Each stream's band of dequantised weights for qlinear, allocated at its first band: calls on
// different streams may run at once.
class QScratch {
 public:
  static void* get(cudaStream_t stream) {
    static QScratch* const s = new QScratch();  // never destroyed, like Lt
    std::lock_guard<std::mutex> lock(s->mu_);
    if (const auto it = s->bands_.find(stream); it != s->bands_.end()) return it->second;
    void* p = allocate_for_stream(
        stream, kQLinearBandBytes, "cuda::qlinear: the first call of more than 16 rows on a stream",
        "band of dequantised weights; run one such linear on it outside capture first");
    s->bands_.emplace(stream, p);
    return p;
  }

 private:
  std::mutex mu_;
  std::map<cudaStream_t, void*> bands_;
};

}  // namespace

namespace {

// Rows of w a band holds: as many as kQLinearBandBytes of bf16 take, in whole 128-row tiles
// where the band is not the whole matrix (a band of 2,340 rows of K 14,336 put the next band's
// output columns off 16-byte alignment, and the two bands' GEMMs took about 270 us where
// cuBLASLt multiplies the whole bf16 matrix in 76).
int64_t band_rows(int64_t N, int64_t K) {
  const int64_t fit = std::max<int64_t>(1, static_cast<int64_t>(kQLinearBandBytes) / (K * 2));
  if (fit >= N) return N;
  return fit >= 128 ? fit / 128 * 128 : fit;
}

// out = x @ w^T through bands of w's rows dequantised to bf16, each then one GEMM into its
// columns of out; returns the bands run. (Dequantising band b + 1 on a side stream into a second
// buffer while band b's GEMM ran measured the same: the GEMMs hold the SMs.)
uint64_t run_bands(const QLinearArgs& a) {
  void* band = QScratch::get(current_stream());
  const int64_t rows = band_rows(a.N, a.K);
  const size_t out_es = element_size(a.out_dtype), bias_es = element_size(a.bias_dtype);
  uint64_t bands = 0;
  for (int64_t n0 = 0; n0 < a.N; n0 += rows) {
    const int64_t n = std::min(rows, a.N - n0);
    qdequant(band, DType::BF16, a.K, a.w, a.wtype, a.N, a.K, n0, n);
    LinearArgs g;
    g.out = static_cast<char*>(a.out) + n0 * out_es;
    g.out_dtype = a.out_dtype;
    g.ldo = a.ldo;
    g.in_dtype = DType::BF16;
    g.x = a.x;
    g.ldx = a.ldx;
    g.w = band;
    g.ldw = a.K;
    g.bias = a.bias ? static_cast<const char*>(a.bias) + n0 * bias_es : nullptr;
    g.bias_dtype = a.bias_dtype;
    g.M = a.M;
    g.N = n;
    g.K = a.K;
    g.accumulate = a.accumulate;
    linear(g);
    --counters().calls;  // one qlinear call, counted by the caller
    ++bands;
  }
  return bands;
}

// Above qgemv's rows, where qgemm applies (qgemm_applies): qgemm or the bands, whichever ran faster
// the first time a problem of its bucket (w's type, N, K, bias or not, M rounded up to a power
// of two) was met outside graph capture, both timed as Lt::fastest times cuBLASLt's candidates
// (the L2 flushed before each run, the median of kTuneRounds). Neither wins everywhere: qgemm
// reads the quantised weights once per 128-row tile but decodes them on the tensor cores' side;
// the bands write and read them as bf16 but multiply at cuBLASLt's speed. In capture, before a
// choice: the bands. Tuning off (set_linear_tuning): qgemm wherever it applies.
class QChoice {
 public:
  static bool use_qgemm(const QLinearArgs& a) {
    if (!g_tune.load(std::memory_order_relaxed)) return true;
    static QChoice* const c = new QChoice();  // never destroyed, like Lt
    const Key key{static_cast<int>(a.wtype), a.N, a.K, std::bit_ceil(static_cast<uint64_t>(a.M)),
                  a.bias != nullptr};
    {
      std::lock_guard<std::mutex> lock(c->mu_);
      if (const auto it = c->chosen_.find(key); it != c->chosen_.end()) return it->second;
    }
    if (capturing()) return false;
    const bool gemm = c->time(a);
    std::lock_guard<std::mutex> lock(c->mu_);
    c->chosen_.emplace(key, gemm);
    return gemm;
  }

 private:
  using Key = std::tuple<int, int64_t, int64_t, uint64_t, bool>;

  // Times both paths on the call's operands (an accumulating call's runs write a scratch
  // matrix); true when qgemm's median is the lower.
  bool time(const QLinearArgs& a) {
    const RelaxedCapture relaxed;
    std::lock_guard<std::mutex> lock(time_mu_);
    const auto scratch = timing_scratch(a.accumulate, a.M, a.ldo, a.N, a.out_dtype);
    QLinearArgs t = a;
    t.accumulate = false;
    if (a.accumulate) t.out = scratch.get();
    const auto run = [&](size_t path) {
      if (path == 0) return qgemm(t);
      run_bands(t);
      return true;
    };
    if (!run(0)) return false;  // a tensor map the driver refused
    run(1);
    const std::vector<float> median = timed_medians(2, events_, [&](size_t c) { run(c); });
    if (g_tune_log) {
      fmt::print(stderr, "llmk: qlinear {} M {} N {} K {}: qgemm {:.1f} us, bands {:.1f} us\n",
                 dtype_name(a.wtype), a.M, a.N, a.K, 1e3f * median[0], 1e3f * median[1]);
    }
    return median[0] <= median[1];
  }

  std::mutex mu_, time_mu_;
  std::map<Key, bool> chosen_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace

bool qlinear_row(const QLinearArgs& a) {
  LLMK_CHECK(a.gated || a.rope, "cuda::qlinear_row: neither a gated output nor a RoPE epilogue");
  if (!qgemv(a)) return false;  // qgemv_applies: K, N and the epilogue's operands
  ++counters().calls;
  ++counters().qgemv;
  return true;
}

void qlinear(const QLinearArgs& a) {
  LLMK_CHECK(a.K > 0 && a.M >= 0 && a.N >= 0, "cuda::qlinear: M {} N {} K {}", a.M, a.N, a.K);
  LLMK_CHECK(!a.gated && !a.rope, "cuda::qlinear: an epilogue is cuda::qlinear_row's");
  if (a.M == 0 || a.N == 0) return;
  ++counters().calls;
  if (qgemv(a)) {
    ++counters().qgemv;
    return;
  }
  if (qgemm_applies(a) && QChoice::use_qgemm(a) && qgemm(a)) {
    ++counters().qgemm;
    return;
  }
  counters().qbands += run_bands(a);
}

void set_linear_gemv(bool on) { g_gemv.store(on, std::memory_order_relaxed); }

void set_linear_tuning(bool on) { g_tune.store(on, std::memory_order_relaxed); }

LinearStats linear_stats() {
  const Counters& c = counters();
  return {c.calls.load(),       c.plans.load(),         c.tuned.load(), c.bias_epilogue.load(),
          c.bias_kernel.load(), c.gelu_epilogue.load(), c.gemv.load(),  c.qgemv.load(),
          c.qgemm.load(),       c.qbands.load()};
}

}  // namespace llmk::cuda
