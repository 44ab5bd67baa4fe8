#!/usr/bin/env bash
# Builds llmk and runs every test: the CUDA build first (preset cuda: compiles all CUDA code;
# its GPU tests run where a GPU exists and report SKIP elsewhere), then every CPU test in the
# Release build (preset cpu) and again under AddressSanitizer + UBSan (preset asan), then runs
# every libFuzzer target for a short time (preset fuzz; docs/fuzzing.md). Installs missing build
# dependencies and fetches the test models (SmolLM2, Gemma 3 270M) first. After the builds, the
# Python package: `pip install .` (its own CPU build, in build/python) and its pytest suite,
# which compares it with the cpu build's program. The cuda preset builds llmk._C with CUDA too.
#
#   scripts/test.sh            # cuda (where nvcc exists) + cpu + asan + fuzz
#   scripts/test.sh --quick    # cpu only
set -euo pipefail
cd "$(dirname "$0")/.."

presets=(cpu asan)
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  presets=(cuda "${presets[@]}")
else
  echo "test.sh: no CUDA toolkit (nvcc) found: skipping the CUDA build" >&2
fi
[ "${1:-}" = "--quick" ] && presets=(cpu)
jobs=$(nproc)

scripts/install-deps.sh
# Generated code must match its generator (a hand edit or a stale header fails here).
python3 src/kernels/cuda/gen-wgmma.py --check
scripts/fetch-models.sh all
for p in "${presets[@]}"; do
  echo "== preset $p: configure, build, test" >&2
  cmake --preset "$p" >/dev/null
  cmake --build --preset "$p" -j "$jobs"
  if [ "$p" = cuda ]; then
    # The CPU tests already ran in the cpu and asan builds; here only the GPU ones.
    ctest --preset cuda -L gpu --timeout 1200
  else
    ctest --preset "$p" -j "$jobs" --timeout 900
  fi
done

echo "== python package: pip install ., pytest" >&2
# CPU only here: the cuda preset above already compiled the extension with CUDA (llmk._C in
# build/cuda), and a second CUDA build of every kernel would double the time CI spends on them.
python3 -m pip install --quiet --no-build-isolation -Cbuild-dir=build/python \
  -Ccmake.define.LLMK_CUDA=OFF .
LLMK_CLI=build/cpu/llmk python3 -m pytest -q tests/python
[ "${1:-}" = "--quick" ] && exit 0

# Every fuzz target from its seeds for 35 s, $jobs at a time: any crash, input slower than 1 s
# or allocation above 2 GB fails the run.
echo "== preset fuzz: configure, build, fuzz each target" >&2
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$jobs"
fuzz/run.sh --seconds 35 --jobs "$jobs"
