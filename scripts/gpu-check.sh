#!/usr/bin/env bash
# The one command for the GPU machine: build (CUDA, sm_90a, all cores), GPU tests normally and
# under compute-sanitizer (memcheck; racecheck and synccheck over the shared-memory kernels), the
# CPU tests of that build, benchmarks, and the comparison with transformers. Writes logs, JSON and summary.md to $OUT (or build/gpu-check).
#
#   scripts/gpu-check.sh                 # build test sanitize bench
#   scripts/gpu-check.sh e2e             # bench/e2e_vs_hf.py (needs torch + transformers)
#   scripts/gpu-check.sh profile         # Nsight Compute: per-kernel time of a decode step
#                                        #   (PROFILE_CONFIG: an e2e_vs_hf.py config;
#                                        #   PROFILE_PROMPT=N: a prefill of N tokens instead)
#   scripts/gpu-check.sh attention       # bench/attention.py: llmk beside torch SDPA, one table
#   scripts/gpu-check.sh long            # Llama-3-8B shapes: decode after an 8000-token prompt
#   scripts/gpu-check.sh pyops           # llmk.ops on CUDA: tests/python/test_ops*.py and
#                                        #   bench/torch_ops.py (the extension built by
#                                        #   scripts/device/build-pyext.sh where .devbin/pylib
#                                        #   is packed, else the llmk that Python imports)
#   scripts/gpu-check.sh build test      # any subset of: build test sanitize bench e2e profile
#                                        #   attention long pyops (sanitize = memcheck racecheck
#                                        #   synccheck, each also a step of its own)
#
# GPU_TEST_FILTER, SANITIZE_FILTER (memcheck) and RACE_FILTER (racecheck, synccheck) narrow the
# GPU tests by gtest filter.
# Binaries: build/cuda (step `build`), or .devbin/ packed elsewhere; the SmolLM2 model may arrive
# in parts under .xfer/. scripts/device/README.md says why (workarounds for the GPU machine).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu-check}
mkdir -p "$out"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build test sanitize bench)
has() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
status=0
summary=$out/summary.md
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

model=models/SmolLM2-135M-Instruct.Q4_1.gguf
parts=$(scripts/device/join-model.sh) || note "model: scripts/device/join-model.sh failed"
[ -n "$parts" ] && note "$parts"
for m in "$model" models/gemma-3-270m-q4_k_m.gguf; do
  [ -f "$m" ] && note "model: $m ($(sha256sum "$m" | cut -c1-12))" || note "model: $m missing"
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/gpu: /' | tee -a "$summary"

if has build; then
  t0=$(date +%s)
  cmake --preset cuda >"$out/configure.log" 2>&1 &&
    cmake --build --preset cuda -j "$(nproc)" >"$out/build.log" 2>&1
  rc=$?
  note "build: rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -ne 0 ] && { tail -n 40 "$out/build.log"; exit 1; }
fi

bin=build/cuda
tests=build/cuda/tests
devbin=${DEVBIN:-.devbin}
if [ ! -x build/cuda/llmk ] && [ -x "$devbin/llmk" ]; then
  bin=$devbin
  tests=$devbin
  export LD_LIBRARY_PATH=$PWD/$devbin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LLMK_SOURCE_DIR=$PWD
  note "binaries: prebuilt in $devbin"
fi

if has test; then
  $tests/gpu_tests ${GPU_TEST_FILTER:+--gtest_filter=$GPU_TEST_FILTER} 2>&1 | tee "$out/gpu_tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |GPU tests on|SmolLM2 CUDA|Failure" | head -60
  rc=${PIPESTATUS[0]}
  note "gpu tests: rc=$rc, $(grep -E '^\[  PASSED  \]' "$out/gpu_tests.log" | head -1)"
  [ $rc -ne 0 ] && status=1
  if [ "$bin" = build/cuda ]; then
    (cd build/cuda && ctest -L cpu -j "$(nproc)" >"$out/cpu_tests.log" 2>&1)
    rc=$?
    note "cpu tests (cuda build): rc=$rc, $(grep 'tests passed' "$out/cpu_tests.log")"
    [ $rc -ne 0 ] && status=1
  fi
fi

# compute-sanitizer over the GPU tests: memcheck (out-of-bounds and misaligned accesses, leaks)
# over all of them; racecheck (shared-memory hazards) and synccheck (barrier misuse: __syncthreads
# in divergent code, mbarrier and warp-sync errors) over the tests of the kernels that share
# memory within a block or work across blocks: attention prefill (both builds), split-KV decode
# (both K/V loaders, the cross-block combine), the fallback kernel, and the block reductions of
# RMSNorm, softmax, argmax and RoPE. Those two tools slow a kernel by 10-100x, hence the subset.
race_filter='Kernels/AttentionPrefillGpu.SingleSequencesMatchCpu/*:Kernels/AttentionPrefillGpu.MixedBatchesMatchCpu/*'
race_filter+=':Loaders/AttentionDecodeGpu.LengthsAndQueryCountsPaged/*:Loaders/AttentionDecodeGpu.ForcedSplits/*'
race_filter+=':Loaders/AttentionDecodeGpu.WindowSoftcapLse/*:Loaders/AttentionDecodeGpu.HeadMajorCaches/*'
race_filter+=':AttentionGenericGpu.*:CudaOpRmsNorm.*:CudaOpAddRmsNorm.*:CudaOpSoftmax.*:CudaOpArgmax.*'
race_filter+=':CudaOpRope.MatchesCpu'
sanitize() {  # tool, log name, gtest filter, extra options...
  local tool=$1 log=$out/$2.log filter=$3
  shift 3
  # API errors are left out: some tests provoke them on purpose (invalid device, 1 PiB).
  timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --report-api-errors no \
    --error-exitcode 99 --print-limit 20 "$@" \
    $tests/gpu_tests ${filter:+--gtest_filter=$filter} >"$log" 2>&1
  local rc=$?
  note "compute-sanitizer $tool: rc=$rc, $(grep -E '^\[  (PASSED|FAILED) ' "$log" | head -1 | tr -s ' '),$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1 | sed 's/^=*//')"
  [ $rc -ne 0 ] && { status=1; grep -E -m 20 "Invalid|ERROR|Error|hazard|FAILED|Race|Barrier" "$log"; }
}
if has sanitize || has memcheck; then sanitize memcheck memcheck "${SANITIZE_FILTER:-}"; fi
if has sanitize || has racecheck; then
  sanitize racecheck racecheck "${RACE_FILTER:-$race_filter}" --racecheck-report all
fi
if has sanitize || has synccheck; then sanitize synccheck synccheck "${RACE_FILTER:-$race_filter}"; fi

if has bench; then
  if [ -f "$model" ]; then
    $bin/llmk bench -m "$model" --prompt-tokens 512 --gen-tokens 256 --json "$out/bench_smollm2.json" \
      2>&1 | tee "$out/bench_smollm2.log" | grep -E "prefill|decode|peak"
    note "bench smollm2: $(grep -E 'decode:' "$out/bench_smollm2.log")"
    $bin/llmk bench -m "$model" --prompt-tokens 512 --gen-tokens 128 --batch 8 \
      --json "$out/bench_smollm2_b8.json" >"$out/bench_smollm2_b8.log" 2>&1
    note "bench smollm2 batch 8: $(grep -E 'decode:' "$out/bench_smollm2_b8.log")"
  fi
  for b in linear_bench norm_rope_bench; do
    exe=$bin/$b
    [ -x "$exe" ] || exe=$bin/bench/$b
    [ -x "$exe" ] && "$exe" | tee "$out/$b.log" | tail -n 16
  done
fi

if has e2e; then
  PYTHONUNBUFFERED=1 python3 bench/e2e_vs_hf.py --llmk $bin/llmk --out "$out" ${E2E_CONFIGS:+--configs $E2E_CONFIGS} 2>&1 | tee "$out/e2e.log" | grep -v -E "it/s|Warning"
  rc=${PIPESTATUS[0]}
  note "e2e vs transformers: rc=$rc"
  grep -E "^\|" "$out/e2e.log" >> "$summary"
  [ $rc -ne 0 ] && status=1
fi

if has attention; then
  python3 bench/attention.py --bin "$bin" --json "$out/attention.json" 2>&1 |
    tee "$out/attention.md" | grep -E "^\||^note"
  rc=${PIPESTATUS[0]}
  note "attention bench: rc=$rc"
  grep -E "^\|" "$out/attention.md" >> "$summary"
  [ $rc -ne 0 ] && status=1
fi

if has pyops; then
  if [ -d "$devbin/pylib" ]; then
    DEVBIN=$devbin scripts/device/build-pyext.sh >"$out/pyext.log" 2>&1 ||
      { note "pyops: build-pyext.sh failed"; tail -n 30 "$out/pyext.log"; status=1; }
    export PYTHONPATH=$PWD/$devbin/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  PYTHONUNBUFFERED=1 python3 -m pytest -q -p no:cacheprovider tests/python/test_ops_cuda.py \
    tests/python/test_ops.py 2>&1 | tee "$out/pytest_ops.log" | tail -n 30
  rc=${PIPESTATUS[0]}
  note "pytest llmk.ops (cuda + cpu): rc=$rc, $(tail -n 1 "$out/pytest_ops.log")"
  [ $rc -ne 0 ] && status=1
  PYTHONUNBUFFERED=1 python3 bench/torch_ops.py --json "$out/torch_ops.json" \
    --png "$out/torch_ops.png" ${TORCH_OPS_ARGS:-} 2>&1 | tee "$out/torch_ops.md"
  rc=${PIPESTATUS[0]}
  note "torch_ops bench: rc=$rc"
  grep -E "^\|" "$out/torch_ops.md" >> "$summary"
  [ $rc -ne 0 ] && status=1
fi

if has long; then
  # Decode of the Llama-3-8B configuration (random bf16 weights) after an 8000-token prompt:
  # attention over ~8k keys is about 15% of each step there.
  llama=/tmp/llmk-e2e/llama-3-8b
  [ -d "$llama" ] || python3 bench/e2e_vs_hf.py --configs llama-3-8b --save-only >/dev/null 2>&1
  $bin/llmk bench -m "$llama" --prompt-tokens 8000 --gen-tokens 128 --reps 3 --device cuda \
    --json "$out/bench_llama3_8b_p8000.json" 2>&1 | tee "$out/bench_llama3_8b_p8000.log" | grep -E "prefill|decode|attention"
  note "llama-3-8b, prompt 8000: $(grep -E 'decode:' "$out/bench_llama3_8b_p8000.log")"
fi

if has profile; then
  # Forward passes of a random-weight model (PROFILE_CONFIG, an e2e_vs_hf.py config; default
  # qwen2.5-0.5b), without graphs so each kernel is timed alone; clocks are left as they are
  # (--clock-control none). PROFILE_PROMPT unset or 1: a decode step (bench --prompt-tokens 1
  # --gen-tokens 2 --reps 1 runs 4 identical one-token passes); N > 1: a prefill of N tokens
  # (--gen-tokens 1: 2 passes, no decode).
  pc=${PROFILE_CONFIG:-qwen2.5-0.5b}
  pp=${PROFILE_PROMPT:-1}
  pm=/tmp/llmk-e2e/$pc
  [ -d "$pm" ] || python3 bench/e2e_vs_hf.py --configs "$pc" --save-only >/dev/null 2>&1
  if [ "$pp" -gt 1 ]; then what=prefill$pp gen=1 passes=2; else what=decode gen=2 passes=4; fi
  ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$out/ncu_${pc}_$what.csv" \
    $bin/llmk bench -m "$pm" --prompt-tokens "$pp" --gen-tokens $gen --reps 1 --no-graph --device cuda \
    >"$out/ncu_run.log" 2>&1
  note "profile $pc $what: rc=$?"
  python3 bench/profile_summary.py "$out/ncu_${pc}_$what.csv" --passes $passes | tee -a "$summary"
fi

echo "---- summary"; cat "$summary"
exit $status
