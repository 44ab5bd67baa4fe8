#!/usr/bin/env bash
# Packs the CUDA build's binaries, and the shared libraries the GPU machine lacks, into .devbin/
# (git-ignored) so that a device call can carry them: the GPU machine has no PCRE2 development
# files to configure a build with, and building here costs no device time.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .devbin && mkdir -p .devbin/lib
cp build/cuda/llmk build/cuda/tests/gpu_tests .devbin/
[ -x build/cuda/bench/linear_bench ] && cp build/cuda/bench/linear_bench .devbin/
for lib in $(ldd build/cuda/llmk build/cuda/tests/gpu_tests | grep -oE '/[^ ]*lib(fmt|pcre2-8)[^ ]*' | sort -u); do
  cp -L "$lib" .devbin/lib/
done
strip --strip-unneeded .devbin/llmk .devbin/gpu_tests .devbin/linear_bench 2>/dev/null || true
du -sh .devbin; ls -la .devbin .devbin/lib
