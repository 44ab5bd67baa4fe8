#!/usr/bin/env bash
# On the GPU machine: puts the test models back together into models/ from the parts
# split-model.sh wrote under .xfer/ (SmolLM2 as smol.part*, Gemma 3 270M as gemma.part*). The
# parts arrive over several device calls, each carrying .xfer/<name>.sha256, so a model is joined
# only when its joined bytes have the model's checksum. Prints one line a model whose parts are
# still missing; silent when the models are there or no parts came.
#   scripts/device/join-model.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
join() {
  local name=$1 model=$2
  [ -f "$model" ] && return 0
  [ -f .xfer/"$name".sha256 ] && ls .xfer/"$name".part* >/dev/null 2>&1 || return 0
  mkdir -p models && cat .xfer/"$name".part* > "$model.tmp"
  if [ "$(sha256sum "$model.tmp" | cut -d' ' -f1)" = "$(cat .xfer/"$name".sha256)" ]; then
    mv "$model.tmp" "$model"
  else
    rm -f "$model.tmp"
    echo "model parts so far: $(ls .xfer/"$name".part* | tr '\n' ' ')(not all there yet)"
  fi
}
join smol models/SmolLM2-135M-Instruct.Q4_1.gguf
join gemma models/gemma-3-270m-q4_k_m.gguf
