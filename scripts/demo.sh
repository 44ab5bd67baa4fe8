#!/usr/bin/env bash
# From a fresh Debian machine to generated text: installs what is missing, builds llmk (CPU),
# fetches SmolLM2-135M-Instruct and runs it. Extra arguments go to `llmk run`.
#
#   scripts/demo.sh                                   # greedy: "The capital of France is"
#   scripts/demo.sh -p "Write a haiku about rain" --chat --temp 0.7
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j "$(nproc)" --target llmk_cli
scripts/fetch-models.sh smollm2
if [ $# -eq 0 ]; then set -- -p "The capital of France is" --temp 0 -n 48; fi
exec build/cpu/llmk run -m models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"
