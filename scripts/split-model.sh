#!/usr/bin/env bash
# Splits the SmolLM2 test model into parts under .xfer/ (git-ignored) small enough for one
# device call each; scripts/gpu-check.sh puts them back together on the device. One call carries
# at most 64 MiB, the working tree (about 14 MB) and packed binaries (about 16 MB) included:
#   scripts/split-model.sh [PART_SIZE]      # default 33M (three parts)
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .xfer && mkdir -p .xfer
split -b "${1:-33M}" -d models/SmolLM2-135M-Instruct.Q4_1.gguf .xfer/smol.part
# Carried with every part: gpu-check.sh joins the parts only once all of them are there.
sha256sum models/SmolLM2-135M-Instruct.Q4_1.gguf | cut -d' ' -f1 > .xfer/smol.sha256
ls -la .xfer
