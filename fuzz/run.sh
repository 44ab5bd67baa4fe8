#!/usr/bin/env bash
# Runs the libFuzzer targets of the fuzz preset (build them first: cmake --preset fuzz &&
# cmake --build --preset fuzz), a few at a time, each from its seeds (fuzz/make-corpus.py) and
# its kept corpus, with the limits of docs/fuzzing.md: 1 s per input, 2 GB of RSS, no single
# allocation above 2 GB. The reproducers of past findings (tests/fixtures/bad/fuzz/<target>-*) run
# first. Fails when any target reports a finding; the reproducer is written to
# build/fuzz/findings/<target>-crash-..., the log to build/fuzz/logs/<target>.log.
#
#   fuzz/run.sh --seconds 35                # every target, 35 s each (scripts/test.sh)
#   fuzz/run.sh --seconds 1800 --runs 1000000 --keep gguf hf_config   # a local campaign
#
# --seconds N   stop each target after N seconds (-max_total_time)
# --runs N      or after N executions (-runs), whichever comes first
# --jobs N      targets at once (default: the number of CPUs)
# --keep        grow build/fuzz/corpus/<target> across runs (default: a scratch corpus)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=30 runs=-1 jobs=$(nproc) keep=0 targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -*) echo "fuzz/run.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
build=build/fuzz
if ((${#targets[@]} == 0)); then
  for f in fuzz/*.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi
for t in "${targets[@]}"; do
  [ -x "$build/fuzz/fuzz_$t" ] || { echo "fuzz/run.sh: $build/fuzz/fuzz_$t missing" >&2; exit 2; }
done

mkdir -p "$build/logs" "$build/findings"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
seeds=$scratch/seeds  # this run's own, so that runs side by side do not race
python3 fuzz/make-corpus.py --out "$seeds" >/dev/null

run_one() {
  local t=$1 corpus dict=()
  if ((keep)); then corpus=$build/corpus/$t; else corpus=$scratch/corpus/$t; fi
  mkdir -p "$corpus"
  case $t in  # one dictionary per format
    gguf | tokenizer_gguf) dict=(-dict=fuzz/dict/gguf.dict) ;;
    safetensors* | hf_config | tokenizer_json) dict=(-dict=fuzz/dict/json.dict) ;;
    chat_template) dict=(-dict=fuzz/dict/chat_template.dict) ;;
  esac
  local start=$SECONDS rc=0
  # First the committed reproducers of past findings (each input run once), then fuzzing.
  local repro=(tests/fixtures/bad/fuzz/"$t"-*)
  : >"$build/logs/$t.log"
  if [ -e "${repro[0]}" ] && ! "$build/fuzz/fuzz_$t" "${repro[@]}" >>"$build/logs/$t.log" 2>&1; then
    echo "FAIL $t: a reproducer in tests/fixtures/bad/fuzz fails again; see $build/logs/$t.log"
    return 1
  fi
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/fuzz/fuzz_$t" "${dict[@]}" -max_total_time="$seconds" -runs="$runs" -timeout=1 \
    -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/findings/$t-" "$corpus" "$seeds/$t" \
    >>"$build/logs/$t.log" 2>&1 || rc=$?
  local execs corp slowest rss
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/logs/$t.log")
  slowest=$(sed -n 's/^stat::slowest_unit_time_sec: *//p' "$build/logs/$t.log")
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$build/logs/$t.log")
  corp=$(grep -o 'corp: [0-9]*/[0-9a-zA-Z]*' "$build/logs/$t.log" | tail -1 | cut -d' ' -f2)
  if ((rc)); then
    echo "FAIL $t: exit $rc after $((SECONDS - start)) s; see $build/logs/$t.log:"
    grep -E "^==[0-9]+==ERROR|^SUMMARY|check failed|llmk::Error message|Test unit written|terminate" \
      "$build/logs/$t.log" | head -5 | sed 's/^/  /'
    return 1
  fi
  echo "ok   $t: ${execs:-?} executions in $((SECONDS - start)) s, corpus ${corp:-?}" \
    "(inputs/bytes), slowest input ${slowest:-?} s, peak RSS ${rss:-?} MB"
}
export -f run_one
export build seconds runs keep scratch seeds

printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {}' && exit 0
echo "fuzz/run.sh: findings above (reproducers in $build/findings)" >&2
exit 1
