// The backward of flash attention (backward.h): FA2's algorithm on mma.sync m16n8k16.
//
// Main kernel: one block of 4 warps per (64-key tile, KV head, sequence). Warp w owns keys
// [16 w, 16 w + 16) of the tile: it computes S^T = K Q^T for its keys (keys are the M dimension,
// so P^T and dS^T sit in registers as the A operands of dV += P^T dO and dK += dS^T Q) and keeps
// its rows of dK and dV in registers across every query tile and every query head of the group.
// dQ = dS K needs a sum over the tile's keys, which four warps hold: dS^T goes to shared memory
// and each warp forms 16 query rows of dQ from it, added to an fp32 accumulator with atomics.
//
// Scores in the log2 domain: P = exp2(s log2(e) - lse2), lse2 = lse log2(e) from the row pass
// (+inf for a row that saw no key, so its P is 0). With a softcap the cap's derivative 1 -
// (s / cap)^2 is formed from P itself: s = (log2 P + lse2) ln 2 (P > 0; where P is 0, so is dS).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "core/cuda/check.h"
#include "core/cuda/stream.h"
#include "kernels/cuda/attention/backward.h"
#include "kernels/cuda/attention/prefill_kernel.cuh"
#include "kernels/cuda/attention/tiles.cuh"

namespace llmk::cuda {

namespace attn {
namespace {

constexpr int kBwdWarps = 4;
constexpr int kBwdThreads = kBwdWarps * kWarp;
constexpr int kBwdBN = 16 * kBwdWarps;  // keys per block: 16 per warp
constexpr int kBwdBM = 16 * kBwdWarps;  // queries per step: 16 per warp in dQ = dS K

// The workspace: dQ's fp32 accumulator [T, Hq, D], then lse2 and delta, [Hq, T] each.
struct BwdWs {
  float* dq_acc;
  float* lse2;
  float* delta;
};
BwdWs bwd_ws(void* ws, int64_t T, int64_t Hq, int64_t D) {
  float* p = static_cast<float*>(ws);
  return {p, p + T * Hq * D, p + T * Hq * D + T * Hq};
}

template <class T16>
__device__ __forceinline__ float to_f32(T16 x) {
  if constexpr (std::is_same_v<T16, __half>) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}

template <class T16>
__device__ __forceinline__ T16 from_f32(float x) {
  if constexpr (std::is_same_v<T16, __half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

// One warp per (query row, head): delta = dO . O - dlse, lse2, and dQ's accumulator zeroed.
template <class T16>
__global__ void bwd_rows_kernel(const AttentionBwdArgs a, BwdWs ws) {
  const int64_t item =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (item >= static_cast<int64_t>(a.T) * a.Hq) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t t = item / a.Hq;
  const int h = static_cast<int>(item % a.Hq);
  const T16* o = static_cast<const T16*>(a.out) + t * a.out_t + h * a.out_h;
  const T16* d = static_cast<const T16*>(a.dout) + t * a.dout_t + h * a.dout_h;
  float* acc = ws.dq_acc + (t * a.Hq + h) * a.D;
  float dot = 0.0f;
  for (int j = lane; j < a.D; j += kWarp) {
    dot += to_f32(o[j]) * to_f32(d[j]);
    acc[j] = 0.0f;
  }
  dot = warp_sum(dot);
  if (lane == 0) {
    const int64_t i = static_cast<int64_t>(h) * a.T + t;
    const float lse = a.lse[i];
    ws.lse2[i] = isinf(lse) ? INFINITY : lse * kLog2e;
    ws.delta[i] = dot - (a.dlse != nullptr ? a.dlse[i] : 0.0f);
  }
}

// dq = the accumulator rounded to 16 bits, over [T, Hq, D].
template <class T16>
__global__ void bwd_dq_kernel(const AttentionBwdArgs a, const float* acc) {
  const int64_t n = static_cast<int64_t>(a.T) * a.Hq * a.D;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / a.D;
    const int64_t t = row / a.Hq, h = row % a.Hq, d = e % a.D;
    static_cast<T16*>(a.dq)[t * a.dq_t + h * a.dq_h + d] = from_f32<T16>(acc[e]);
  }
}

template <int kD>
struct BwdCfg {
  static constexpr int kP = kD + 8;       // Q, dO, K, V tile pitch (elements)
  static constexpr int kPS = kBwdBM + 8;  // dS^T tile pitch, [key][query]
  static constexpr size_t kSmemBytes =
      static_cast<size_t>(2 * kBwdBN + 2 * kBwdBM) * kP * 2 + kBwdBN * kPS * 2 + 2 * kBwdBM * 4;
};

template <int kD, class T16>
__global__ void __launch_bounds__(kBwdThreads, 2)
    bwd_main_kernel(const AttentionBwdArgs a, BwdWs ws) {
  using E = MmaElem<T16>;
  using C = BwdCfg<kD>;
  constexpr int kP = C::kP, kPS = C::kPS, kBN = kBwdBN, kBM = kBwdBM;
  constexpr int kDT = kD / 8;   // n-tiles of 8 over the head dim
  constexpr int kNT = kBM / 8;  // n-tiles of 8 over a step's queries
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t sK = smem_addr(smem_raw), sV = sK + kBN * kP * 2, sQ = sV + kBN * kP * 2,
                 sdO = sQ + kBM * kP * 2, sS = sdO + kBM * kP * 2;
  float* s_lse = reinterpret_cast<float*>(smem_raw + (2 * kBN + 2 * kBM) * kP * 2 + kBN * kPS * 2);
  float* s_delta = s_lse + kBM;

  const int b = blockIdx.y, hk = blockIdx.z;
  const int k0 = a.cu_k[b], tk = a.cu_k[b + 1] - k0;
  const int q0 = a.cu_q[b], tq = a.cu_q[b + 1] - q0;
  const int n0 = static_cast<int>(blockIdx.x) * kBN;
  if (n0 >= tk) return;
  const int off = tk - tq;  // query i sits at key position i + off
  const int right = a.causal ? 0 : a.window_right, left = a.window_left;
  // The queries that see some key of [n0, n0 + kBN).
  int i_lo = 0, i_hi = tq;
  if (right >= 0) i_lo = max(0, n0 - off - right);
  if (left >= 0) i_hi = min(tq, n0 + kBN - off + left);
  const int group = a.Hq / a.Hkv;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const bool capped = a.softcap > 0.0f;

  const uint16_t* k_base =
      static_cast<const uint16_t*>(a.k) + static_cast<int64_t>(k0 + n0) * a.k_t + hk * a.k_h;
  const uint16_t* v_base =
      static_cast<const uint16_t*>(a.v) + static_cast<int64_t>(k0 + n0) * a.v_t + hk * a.v_h;
  prefill_detail::load_rows<kBN, kD, kP, kBwdThreads>(sK, k_base, a.k_t, tk - n0);
  prefill_detail::load_rows<kBN, kD, kP, kBwdThreads>(sV, v_base, a.v_t, tk - n0);
  cp_async_commit();

  // ldmatrix lane addresses (bytes, relative to a tile): A operand from [row][k] rows 16 w..;
  // B operand from [n][k] storage; B operand (.trans) from [k][n] storage.
  const uint32_t a_lane = ((warp * 16 + lane % 16) * kP + (lane / 16) * 8) * 2;
  const uint32_t b_lane = ((lane % 8 + (lane / 16) * 8) * kP + ((lane / 8) % 2) * 8) * 2;
  const uint32_t bt_lane = ((lane % 8 + ((lane / 8) % 2) * 8) * kP + (lane / 16) * 8) * 2;
  // dS (A operand of dS K, [query][key]) from its [key][query] storage, .trans.
  const uint32_t s_lane =
      sS + ((lane % 8 + (lane / 16) * 8) * kPS + warp * 16 + ((lane / 8) % 2) * 8) * 2;

  float dk[kDT][4], dv[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i)
#pragma unroll
    for (int x = 0; x < 4; ++x) dk[i][x] = dv[i][x] = 0.0f;

  // This thread's keys within the tile: warp * 16 + lane / 4 + 8 r.
  const int key_base = n0 + warp * 16 + lane / 4;

  for (int g = 0; g < group; ++g) {
    const int h = hk * group + g;
    const uint16_t* q_base = static_cast<const uint16_t*>(a.q) + static_cast<int64_t>(q0) * a.q_t +
                             static_cast<int64_t>(h) * a.q_h;
    const uint16_t* do_base = static_cast<const uint16_t*>(a.dout) +
                              static_cast<int64_t>(q0) * a.dout_t +
                              static_cast<int64_t>(h) * a.dout_h;
    for (int i0 = i_lo; i0 < i_hi; i0 += kBM) {
      __syncthreads();  // the previous step is done with Q, dO, dS and the row values
      const int rows = min(kBM, tq - i0);
      prefill_detail::load_rows<kBM, kD, kP, kBwdThreads>(sQ, q_base + i0 * a.q_t, a.q_t, rows);
      prefill_detail::load_rows<kBM, kD, kP, kBwdThreads>(sdO, do_base + i0 * a.dout_t, a.dout_t,
                                                          rows);
      cp_async_commit();
      if (threadIdx.x < kBM) {
        const int i = i0 + static_cast<int>(threadIdx.x);
        const int64_t at = static_cast<int64_t>(h) * a.T + q0 + i;
        s_lse[threadIdx.x] = i < tq ? ws.lse2[at] : INFINITY;
        s_delta[threadIdx.x] = i < tq ? ws.delta[at] : 0.0f;
      }
      cp_async_wait<0>();
      __syncthreads();

      // S^T = K Q^T: the warp's 16 keys x kBM queries.
      float st[kNT][4];
#pragma unroll
      for (int j = 0; j < kNT; ++j) st[j][0] = st[j][1] = st[j][2] = st[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t ka[4];
        ldsm_x4(ka, sK + a_lane + kk * 32);
#pragma unroll
        for (int j2 = 0; j2 < kBM / 16; ++j2) {
          uint32_t qb[4];
          ldsm_x4(qb, sQ + b_lane + (j2 * 16 * kP + kk * 16) * 2);
          E::mma(st[2 * j2], ka, qb[0], qb[1]);
          E::mma(st[2 * j2 + 1], ka, qb[2], qb[3]);
        }
      }
      // P^T, 0 where a key is not seen (masks, the ends of the keys and of the queries).
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int key = key_base + (x / 2) * 8;
          const int col = j * 8 + (lane % 4) * 2 + (x % 2);
          const int p = i0 + col + off;
          const bool seen = key < tk && i0 + col < tq && (right < 0 || key <= p + right) &&
                            (left < 0 || key >= p - left);
          float s = st[j][x] * a.scale;
          if (capped) s = a.softcap * tanhf(s / a.softcap);
          st[j][x] = seen ? exp2f(s * kLog2e - s_lse[col]) : 0.0f;
        }
        // dV += P^T dO.
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        uint32_t pa[4];
        prefill_detail::p_fragment<E>(pa, *reinterpret_cast<const float(*)[1][kNT][4]>(&st), 0, kk);
#pragma unroll
        for (int dn2 = 0; dn2 < kD / 16; ++dn2) {
          uint32_t ob[4];
          ldsm_x4_t(ob, sdO + bt_lane + (kk * 16 * kP + dn2 * 16) * 2);
          E::mma(dv[2 * dn2], pa, ob[0], ob[1]);
          E::mma(dv[2 * dn2 + 1], pa, ob[2], ob[3]);
        }
      }
      // dP^T = V dO^T.
      float dp[kNT][4];
#pragma unroll
      for (int j = 0; j < kNT; ++j) dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t va[4];
        ldsm_x4(va, sV + a_lane + kk * 32);
#pragma unroll
        for (int j2 = 0; j2 < kBM / 16; ++j2) {
          uint32_t ob[4];
          ldsm_x4(ob, sdO + b_lane + (j2 * 16 * kP + kk * 16) * 2);
          E::mma(dp[2 * j2], va, ob[0], ob[1]);
          E::mma(dp[2 * j2 + 1], va, ob[2], ob[3]);
        }
      }
      // dS^T = P^T (dP^T - delta) scale (x the cap's derivative), into dp.
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int col = j * 8 + (lane % 4) * 2 + (x % 2);
          const float pv = st[j][x];
          float ds = pv * (dp[j][x] - s_delta[col]) * a.scale;
          if (capped && pv > 0.0f) {
            const float s = (__log2f(pv) + s_lse[col]) * 0.69314718055994531f / a.softcap;
            ds *= 1.0f - s * s;
          }
          dp[j][x] = ds;
        }
        // dK += dS^T Q.
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        uint32_t sa[4];
        prefill_detail::p_fragment<E>(sa, *reinterpret_cast<const float(*)[1][kNT][4]>(&dp), 0, kk);
#pragma unroll
        for (int dn2 = 0; dn2 < kD / 16; ++dn2) {
          uint32_t qb[4];
          ldsm_x4_t(qb, sQ + bt_lane + (kk * 16 * kP + dn2 * 16) * 2);
          E::mma(dk[2 * dn2], sa, qb[0], qb[1]);
          E::mma(dk[2 * dn2 + 1], sa, qb[2], qb[3]);
        }
      }
      // dS^T to shared memory, [key][query].
      uint16_t* ss = reinterpret_cast<uint16_t*>(smem_raw + (2 * kBN + 2 * kBM) * kP * 2);
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = warp * 16 + lane / 4 + 8 * r, col = j * 8 + (lane % 4) * 2;
          *reinterpret_cast<uint32_t*>(ss + row * kPS + col) =
              E::pack(dp[j][2 * r], dp[j][2 * r + 1]);
        }
      __syncthreads();
      // dQ (the warp's 16 query rows) = dS K over the tile's keys, added to the accumulator.
      float dq[kDT][4];
#pragma unroll
      for (int i = 0; i < kDT; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t sa[4];
        ldsm_x4_t(sa, s_lane + kk * 16 * kPS * 2);
#pragma unroll
        for (int dn2 = 0; dn2 < kD / 16; ++dn2) {
          uint32_t kb[4];
          ldsm_x4_t(kb, sK + bt_lane + (kk * 16 * kP + dn2 * 16) * 2);
          E::mma(dq[2 * dn2], sa, kb[0], kb[1]);
          E::mma(dq[2 * dn2 + 1], sa, kb[2], kb[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = i0 + warp * 16 + lane / 4 + 8 * r;
        if (i >= tq) continue;
        float* dst = ws.dq_acc + (static_cast<int64_t>(q0 + i) * a.Hq + h) * kD + (lane % 4) * 2;
#pragma unroll
        for (int dn = 0; dn < kDT; ++dn) {
          atomicAdd(reinterpret_cast<float2*>(dst + dn * 8),
                    make_float2(dq[dn][2 * r], dq[dn][2 * r + 1]));
        }
      }
    }
  }
  cp_async_wait<0>();  // a block whose keys no query sees has only its K/V copies in flight

  // dK and dV of the warp's keys.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_base + 8 * r;
    if (key >= tk) continue;
    T16* dkr = static_cast<T16*>(a.dk) + static_cast<int64_t>(k0 + key) * a.dk_t + hk * a.dk_h +
               (lane % 4) * 2;
    T16* dvr = static_cast<T16*>(a.dv) + static_cast<int64_t>(k0 + key) * a.dv_t + hk * a.dv_h +
               (lane % 4) * 2;
#pragma unroll
    for (int dn = 0; dn < kDT; ++dn) {
      *reinterpret_cast<uint32_t*>(dkr + dn * 8) = E::pack(dk[dn][2 * r], dk[dn][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dvr + dn * 8) = E::pack(dv[dn][2 * r], dv[dn][2 * r + 1]);
    }
  }
}

template <int kD, class T16>
void launch_bwd(const AttentionBwdArgs& a, BwdWs ws) {
  constexpr auto kernel = bwd_main_kernel<kD, T16>;
  static const bool smem_raised = [] {
    LLMK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(BwdCfg<kD>::kSmemBytes)));
    return true;
  }();
  (void)smem_raised;
  const dim3 grid(static_cast<unsigned>(ceil_div(a.max_tk, kBwdBN)), static_cast<unsigned>(a.B),
                  static_cast<unsigned>(a.Hkv));
  kernel<<<grid, kBwdThreads, BwdCfg<kD>::kSmemBytes, current_stream()>>>(a, ws);
  check_launch("attention backward");
}

// False (nothing launched) for a head dim not built.
template <class T16>
bool run_bwd(const AttentionBwdArgs& a) {
  if (!(a.D >= 64 && a.D <= 128 && a.D % 16 == 0)) return false;
  const BwdWs ws = bwd_ws(a.workspace, a.T, a.Hq, a.D);
  const int64_t rows = static_cast<int64_t>(a.T) * a.Hq;
  if (rows > 0) {
    constexpr int kRowsPerBlock = 8;
    bwd_rows_kernel<T16><<<static_cast<unsigned>(ceil_div(rows, kRowsPerBlock)),
                           kRowsPerBlock * kWarp, 0, current_stream()>>>(a, ws);
    check_launch("attention backward rows");
  }
  if (a.max_tk > 0) {
    switch (a.D) {
      case 64:
        launch_bwd<64, T16>(a, ws);
        break;
      case 80:
        launch_bwd<80, T16>(a, ws);
        break;
      case 96:
        launch_bwd<96, T16>(a, ws);
        break;
      case 112:
        launch_bwd<112, T16>(a, ws);
        break;
      case 128:
        launch_bwd<128, T16>(a, ws);
        break;
      default:
        return false;
    }
  }
  if (rows > 0) {
    const int64_t n = rows * a.D;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 65536));
    bwd_dq_kernel<T16><<<blocks, 256, 0, current_stream()>>>(a, ws.dq_acc);
    check_launch("attention backward dq");
  }
  return true;
}

}  // namespace
}  // namespace attn

bool launch_attention_backward(const AttentionBwdArgs& a) {
  return a.fp16 ? attn::run_bwd<__half>(a) : attn::run_bwd<__nv_bfloat16>(a);
}

}  // namespace llmk::cuda
