#!/usr/bin/env bash
# On the GPU machine: puts the SmolLM2 test model back together into models/ from the parts
# split-model.sh wrote under .xfer/. The parts arrive over several device calls, each carrying
# .xfer/smol.sha256, so they are joined only when the joined bytes have the model's checksum.
# Prints one line while parts are missing; silent when the model is there or no parts came.
#   scripts/device/join-model.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] && exit 0
[ -f .xfer/smol.sha256 ] && ls .xfer/smol.part* >/dev/null 2>&1 || exit 0
mkdir -p models && cat .xfer/smol.part* > "$model.tmp"
if [ "$(sha256sum "$model.tmp" | cut -d' ' -f1)" = "$(cat .xfer/smol.sha256)" ]; then
  mv "$model.tmp" "$model"
else
  rm -f "$model.tmp"
  echo "model parts so far: $(ls .xfer/smol.part* | tr '\n' ' ')(not all there yet)"
fi
