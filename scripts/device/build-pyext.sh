#!/usr/bin/env bash
# On the GPU machine: builds llmk._C with CUDA from the prebuilt libraries packed by
# `pack-devbin.sh --python` and installs the package into $DEVBIN/site (put it on PYTHONPATH).
#   scripts/device/build-pyext.sh        # DEVBIN defaults to .devbin
set -euo pipefail
cd "$(dirname "$0")/../.."
devbin=$(realpath "${DEVBIN:-.devbin}")
[ -d "$devbin/pylib" ] || { echo "build-pyext: $devbin/pylib missing (pack-devbin.sh --python)" >&2; exit 2; }
export PYTHONPATH="$devbin/nanobind-site${PYTHONPATH:+:$PYTHONPATH}"
cmake -S scripts/device/pyext -B build/pyext -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLLMK_SRC="$PWD" -DLLMK_DEVBIN="$devbin" >/dev/null
cmake --build build/pyext -j "$(nproc)"
rm -rf "$devbin/site" && mkdir -p "$devbin/site"
cp -r python/llmk "$devbin/site/"
cp build/pyext/_C*.so "$devbin/site/llmk/"
echo "build-pyext: llmk with CUDA in $devbin/site"
