#!/usr/bin/env bash
# Builds llmk and runs every CPU test: the Release build (preset cpu), then the same tests
# under AddressSanitizer + UBSan (preset asan). GPU tests report SKIP on a machine without
# a GPU. Installs missing build dependencies and fetches the test model first.
#
#   scripts/test.sh            # cpu + asan
#   scripts/test.sh --quick    # cpu only
set -euo pipefail
cd "$(dirname "$0")/.."

presets=(cpu asan)
[ "${1:-}" = "--quick" ] && presets=(cpu)
jobs=$(nproc)

scripts/install-deps.sh
scripts/fetch-models.sh smollm2
for p in "${presets[@]}"; do
  echo "== preset $p: configure, build, test" >&2
  cmake --preset "$p" >/dev/null
  cmake --build --preset "$p" -j "$jobs"
  ctest --preset "$p" -j "$jobs" --timeout 900
done
