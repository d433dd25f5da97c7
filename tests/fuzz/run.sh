#!/usr/bin/env bash
# Builds the libFuzzer targets with clang under ASan + UBSan in build-fuzz/, replays the committed
# seed corpus (tests/fuzz/corpus/<target>/) and then fuzzes each target for a short time.
# Usage: tests/fuzz/run.sh [seconds per target, default 25]
#        COHORT_FUZZ_REPLAY_ONLY=1 tests/fuzz/run.sh     (replay the corpus only)
#        COHORT_FUZZ_BUILD_ONLY=1 tests/fuzz/run.sh      (build the targets, run nothing)
# New inputs found go to build-fuzz/corpus/<target>/ (not committed); crashes to
# build-fuzz/findings/<target>/. Exits non-zero on the first crash.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-25}
build=${COHORT_FUZZ_BUILD:-build-fuzz}
targets=(fuzz_envelope fuzz_reassembly fuzz_handshake fuzz_config)

CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCOHORT_FUZZ=ON -DCOHORT_SANITIZE=address,undefined -DCOHORT_WITH_CUDA=OFF \
  -DCOHORT_BUILD_BENCH=OFF -DCOHORT_NATIVE=OFF >/dev/null
cmake --build "$build" -j "${COHORT_FUZZ_JOBS:-2}" --target "${targets[@]}"
if [ "${COHORT_FUZZ_BUILD_ONLY:-0}" = "1" ]; then exit 0; fi

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in "${targets[@]}"; do
  seeds=tests/fuzz/corpus/$t
  echo "== $t: replaying $(ls "$seeds" | wc -l) seeds"
  "$build/bin/$t" -runs=0 "$seeds"
  if [ "${COHORT_FUZZ_REPLAY_ONLY:-0}" = "1" ]; then continue; fi
  mkdir -p "$build/corpus/$t" "$build/findings/$t"
  echo "== $t: fuzzing for ${seconds}s"
  log="$build/fuzz-$t.log"
  "$build/bin/$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$build/findings/$t/" "$build/corpus/$t" "$seeds" \
    > "$log" 2>&1 || true
  # The seeds' coverage, the last coverage reached, the totals, and any report.
  grep -E '^#[0-9]+[[:space:]]+INITED' "$log" || true
  grep -E '^#[0-9]+[[:space:]].*cov:' "$log" | tail -1 || true
  grep -E '^(==|SUMMARY|stat::(number_of_executed_units|average_exec_per_sec|new_units_added)|.*ERROR)' "$log" || true
  if [ -n "$(ls -A "$build/findings/$t")" ]; then
    echo "fuzz: $t found a crash: $(ls "$build/findings/$t")" >&2
    exit 1
  fi
done
echo "fuzz: all targets clean"
