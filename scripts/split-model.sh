#!/usr/bin/env bash
# Splits the SmolLM2 test model into parts under .xfer/ (git-ignored) small enough for one
# device call each; scripts/gpu-check.sh puts them back together on the device.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .xfer
split -b 50M -d models/SmolLM2-135M-Instruct.Q4_1.gguf .xfer/smol.part
ls -la .xfer
