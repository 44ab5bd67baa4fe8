#!/usr/bin/env bash
# Splits a test model into parts under .xfer/ (git-ignored), each small enough for one device
# call (scripts/device/README.md says why); join-model.sh puts them back together there.
#   scripts/device/split-model.sh [smol|gemma [PART_SIZE]]   # default smol; parts of 33M
#     smol:  models/SmolLM2-135M-Instruct.Q4_1.gguf (98 MB, three parts)
#     gemma: models/gemma-3-270m-q4_k_m.gguf (253 MB, eight parts)
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:-smol}
case "$name" in
  smol) model=models/SmolLM2-135M-Instruct.Q4_1.gguf ;;
  gemma) model=models/gemma-3-270m-q4_k_m.gguf ;;
  *) echo "split-model: unknown model '$name' (smol or gemma)" >&2; exit 2 ;;
esac
[ -f "$model" ] || { echo "split-model: $model is missing: run scripts/fetch-models.sh" >&2; exit 1; }
mkdir -p .xfer && rm -f .xfer/"$name".part* .xfer/"$name".sha256
split -b "${2:-33M}" -d "$model" .xfer/"$name".part
# Carried with every part: join-model.sh joins the parts only once all of them are there.
sha256sum "$model" | cut -d' ' -f1 > .xfer/"$name".sha256
ls -la .xfer/"$name".*
