#!/usr/bin/env bash
# Prompt and generation speed of `llmk run` on this machine's CPU: the median of several runs
# of the same greedy generation, as docs/perf.md reports it.
#
#   scripts/bench-cpu.sh [runs=5] [extra llmk run args...]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
shift || true
bin=build/cpu/llmk
[ -x "$bin" ] || { echo "bench-cpu: build first (cmake --preset cpu && cmake --build --preset cpu)" >&2; exit 1; }
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
# A prompt of ~128 tokens (bench/cpu_prompt.txt, which bench/cpu_peer.py reads too), so that the
# prompt rate measures a batched prefill.
prompt=$(cat bench/cpu_prompt.txt)
cmd=("$bin" run -m "$model" -p "$prompt" --temp 0 -n 128 --ignore-eos "$@")
echo "command: ${cmd[*]}" >&2
pp=(); tg=()
for i in $(seq "$runs"); do
  line=$("${cmd[@]}" 2>&1 >/dev/null | grep '^\[llmk\]')
  echo "run $i: $line" >&2
  pp+=("$(sed -E 's/.*prompt ([0-9]+) tokens, ([0-9.]+) tokens\/s.*/\2/' <<<"$line")")
  tg+=("$(sed -E 's/.*generation ([0-9]+) tokens, ([0-9.]+) tokens\/s.*/\2/' <<<"$line")")
  ptok=$(sed -E 's/.*prompt ([0-9]+) tokens.*/\1/' <<<"$line")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "prompt ($ptok tokens): median $(median "${pp[@]}") tokens/s; generation (128 tokens): median $(median "${tg[@]}") tokens/s over $runs runs; $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
