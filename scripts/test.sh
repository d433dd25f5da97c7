#!/usr/bin/env bash
# Installs what the build needs, builds Cohort (Release, CUDA when nvcc is found), runs every test
# with CTest, installs it and runs examples/custom_aggregator and examples/custom_trainer against
# the installed package, then
# runs the suite again under AddressSanitizer + UBSan, the transport and server tests under
# ThreadSanitizer, and the libFuzzer targets (corpus replay plus a short fuzz of each).
# Usage: ./scripts/test.sh            (what CI runs)
#        COHORT_TEST_SKIP_ASAN=1 COHORT_TEST_SKIP_TSAN=1 COHORT_TEST_SKIP_FUZZ=1 ./scripts/test.sh
#                                     (faster local loop)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# CTest runs two tests at a time (COHORT_CTEST_JOBS to change): most tests keep less than one core
# busy (processes that wait on each other, on links and deadlines). Tests that must not share the
# machine say so in their CTest properties (RUN_SERIAL, RESOURCE_LOCK, PROCESSORS:
# cmake/CohortHelpers.cmake).
ctest_jobs=${COHORT_CTEST_JOBS:-2}
skip_asan=${COHORT_TEST_SKIP_ASAN:-0} skip_tsan=${COHORT_TEST_SKIP_TSAN:-0}
skip_fuzz=${COHORT_TEST_SKIP_FUZZ:-0}

# The next pass's build runs in the background while a pass's tests run, under SCHED_IDLE: it gets
# a core only when no test wants it, and the tests leave much of the machine idle, waiting on
# processes, links and deadlines (docs/PERFORMANCE.md 13). Its output goes to a log, printed when the script waits for it. The
# tests labelled serial (they compare CPU speeds, or take the machine: RUN_SERIAL) run only once
# no build is left in the background.
background=
background_log=
start_background() {  # LOG COMMAND...: COMMAND (a program or a function) in a SCHED_IDLE subshell
  background_log=$1
  shift
  (chrt --idle --pid 0 "$BASHPID" && "$@") > "$background_log" 2>&1 &
  background=$!
}
wait_background() {
  [ -n "$background" ] || return 0
  local status=0
  wait "$background" || status=$?
  background=
  cat "$background_log"
  if [ "$status" != 0 ]; then
    echo "test.sh: the background build failed (exit $status): $background_log" >&2
    exit "$status"
  fi
}
kill_tree() {
  local child
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
# A failed test ends the script: the build left in the background goes with it.
trap '[ -z "$background" ] || kill_tree "$background"' EXIT

bash scripts/install-deps.sh

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOHORT_WITH_CUDA=AUTO
cmake --build build -j "$jobs"

# The sanitizer pass's tree (built in the background during the Release tests): every unit,
# integration, process and fault test but the network-namespace ones (root), the benchmark smoke
# runs, the long runs (label long, and the test cases in doctest's suite "long": whole runs kept
# for their learning outcome or a deadline they wait out, whose code paths shorter cases cover)
# and the Python checkers of what the operator sees (label python: the dashboard in Chromium,
# TensorBoard's reader, the manifests' linters; their C++ runs under ASan in cohort_observe_tests
# and cohort_core_tests), which run in the Release pass. The libraries build at -O2, the
# executables' own files at -O0 (CMakeLists.txt, cohort_sanitizer_glue_at_O0); -g1 (line tables
# only) is all a sanitizer report needs. Only what those tests run is built: their executables
# and the programs they start (cohort-bench-ps among them, driven by the integration tests), not
# the other benchmarks and root-only tests.
if [ "$skip_asan" != "1" ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOHORT_WITH_CUDA=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DCOHORT_SANITIZE=address,undefined -DCOHORT_BUILD_BENCH=ON
  start_background build/background-asan.log cmake --build build-asan -j "$jobs" --target cohort_unprivileged_tests
fi

ctest --test-dir build --output-on-failure --timeout 600 -j "$ctest_jobs" -LE serial

# The installed package as a user meets it: cmake --install into build/install, then
# examples/custom_aggregator (its own CMake project, find_package(Cohort)) built against it in
# build/custom_aggregator, and a short federation with its rule as a plug-in and embedded; then
# examples/custom_trainer (a local training rule as a plug-in of cohort-client and cohort-sim).
rm -rf build/install build/custom_aggregator build/custom_trainer
cmake --install build --prefix build/install
examples/custom_aggregator/run.sh --prefix build/install --build build/custom_aggregator
examples/custom_trainer/run.sh --prefix build/install --build build/custom_trainer

wait_background
ctest --test-dir build --output-on-failure --timeout 600 -j "$ctest_jobs" -L serial

# ThreadSanitizer over the transport and a real server with clients (the bad-input tests), and the
# fuzz targets (clang, libFuzzer): both trees build in the background during the ASan tests.
# libzmq is not built with TSan: tests/sanitizers/tsan.supp silences reports inside it only.
tsan_targets=(cohort_transport_tests cohort_transport_security_tests cohort_checkpoint_tests
  cohort_bad_input_tests)
if [ "$skip_tsan" != "1" ]; then
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOHORT_WITH_CUDA=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DCOHORT_SANITIZE=thread -DCOHORT_BUILD_BENCH=OFF
fi
later_builds() {
  if [ "$skip_tsan" != "1" ]; then
    cmake --build build-tsan -j "$jobs" --target "${tsan_targets[@]}" cohort-server cohort-client \
      cohort-transport-demo cohort-keygen
  fi
  if [ "$skip_fuzz" != "1" ]; then
    COHORT_FUZZ_BUILD_ONLY=1 tests/fuzz/run.sh
  fi
}

if [ "$skip_asan" != "1" ]; then
  start_background build/background-later.log later_builds
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  ctest --test-dir build-asan --output-on-failure --timeout 900 -j "$ctest_jobs" \
    -LE 'root|bench|long|python|serial'
  wait_background
  ctest --test-dir build-asan --output-on-failure --timeout 900 -j "$ctest_jobs" \
    -L serial -LE 'root|bench|long|python'
  unset ASAN_OPTIONS UBSAN_OPTIONS
else
  later_builds
fi

if [ "$skip_tsan" != "1" ]; then
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/sanitizers/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure --timeout 900 -j "$ctest_jobs" \
    -R "^($(IFS='|'; echo "${tsan_targets[*]}"))\$"
fi

if [ "$skip_fuzz" != "1" ]; then
  # The fuzz targets replay the committed corpus, then fuzz 6 s each (CI's budget; run
  # tests/fuzz/run.sh 600 for a real session). Their build is already done.
  COHORT_FUZZ_SECONDS=${COHORT_FUZZ_SECONDS:-6}
  tests/fuzz/run.sh "$COHORT_FUZZ_SECONDS"
fi
