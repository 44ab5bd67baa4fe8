#!/usr/bin/env bash
# Packs the CUDA build's binaries, and the shared libraries the GPU machine lacks, into .devbin/
# (git-ignored) so that a device call can carry them (scripts/device/README.md says why): fmt,
# PCRE2, utf8proc, and llmk serve's cpp-httplib with the brotli and OpenSSL libraries it links.
#
#   scripts/device/pack-devbin.sh [BUILD_DIR [DEST]]   # defaults: build/cuda .devbin
# Every executable under BUILD_DIR/bench is packed too. gpu-check.sh finds DEST through $DEVBIN.
# With PY_BUILD set (a build of the libraries with CMAKE_POSITION_INDEPENDENT_CODE=ON and CUDA),
# its static libraries, the fmt headers they were built with and nanobind are packed as well, for
# build-pyext.sh (the Python extension with CUDA, built on the GPU machine for its Python).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/cuda}
dest=${2:-.devbin}
case "$dest" in .devbin*) ;; *) echo "pack-devbin: DEST must start with .devbin (git-ignored)" >&2; exit 2 ;; esac
rm -rf "$dest" && mkdir -p "$dest/lib"
cp "$build/llmk" "$build/tests/gpu_tests" "$dest/"
for b in "$build"/bench/*; do
  [ -f "$b" ] && [ -x "$b" ] && cp "$b" "$dest/"
done
for lib in $(ldd "$dest"/* 2>/dev/null | grep -oE '/[^ ]*lib(fmt|pcre2-8|utf8proc|cpp-httplib|brotli[a-z]*|ssl|crypto)[^ ]*' | sort -u); do
  cp -L "$lib" "$dest/lib/"
done
find "$dest" -maxdepth 1 -type f -exec strip --strip-unneeded {} \; 2>/dev/null || true
if [ -n "${PY_BUILD:-}" ]; then
  mkdir -p "$dest/pylib" "$dest/include" "$dest/nanobind-site"
  cp "$PY_BUILD"/libllmk_*.a "$dest/pylib/"
  strip --strip-debug "$dest"/pylib/*.a
  cp -r /usr/include/fmt "$dest/include/"
  cp -r "$(python3 -c 'import nanobind, os; print(os.path.dirname(nanobind.__file__))')" \
    "$dest/nanobind-site/"
fi
du -sh "$dest"; ls -la "$dest" "$dest/lib"
