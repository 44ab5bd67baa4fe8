#!/usr/bin/env bash
# Splits the SmolLM2 test model into parts under .xfer/ (git-ignored), each small enough for one
# device call (scripts/device/README.md says why); join-model.sh puts them back together there.
#   scripts/device/split-model.sh [PART_SIZE]      # default 33M (three parts)
set -euo pipefail
cd "$(dirname "$0")/../.."
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
rm -rf .xfer && mkdir -p .xfer
split -b "${1:-33M}" -d "$model" .xfer/smol.part
# Carried with every part: join-model.sh joins the parts only once all of them are there.
sha256sum "$model" | cut -d' ' -f1 > .xfer/smol.sha256
ls -la .xfer
