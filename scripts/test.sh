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

bash scripts/install-deps.sh

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOHORT_WITH_CUDA=AUTO
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure --timeout 600 -j "$ctest_jobs"

# The installed package as a user meets it: cmake --install into build/install, then
# examples/custom_aggregator (its own CMake project, find_package(Cohort)) built against it in
# build/custom_aggregator, and a short federation with its rule as a plug-in and embedded; then
# examples/custom_trainer (a local training rule as a plug-in of cohort-client and cohort-sim).
rm -rf build/install build/custom_aggregator build/custom_trainer
cmake --install build --prefix build/install
examples/custom_aggregator/run.sh --prefix build/install --build build/custom_aggregator
examples/custom_trainer/run.sh --prefix build/install --build build/custom_trainer

if [ "${COHORT_TEST_SKIP_ASAN:-0}" != "1" ]; then
  # The test suite again under AddressSanitizer + UBSan: every unit, integration, process and
  # fault test but the network-namespace ones (root), the benchmark smoke runs, the long runs
  # (label long, and the test cases in doctest's suite "long": whole runs kept for their learning
  # outcome or a deadline they wait out, whose code paths shorter cases cover) and the Python
  # checkers of what the operator sees (label python: the dashboard in Chromium, TensorBoard's
  # reader, the manifests' linters; their C++ runs under ASan in cohort_observe_tests and
  # cohort_core_tests), which run in the Release pass above. -g1 (line tables only) is all a sanitizer report needs, and compiles and
  # links much faster.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOHORT_WITH_CUDA=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DCOHORT_SANITIZE=address,undefined -DCOHORT_BUILD_BENCH=ON
  # Only what those tests run: their executables and the programs they start (cohort-bench-ps
  # among them, driven by the integration tests), not the other benchmarks and root-only tests
  # (a quarter of this build on 2 cores).
  cmake --build build-asan -j "$jobs" --target cohort_unprivileged_tests
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure --timeout 900 -j "$ctest_jobs" \
    -LE 'root|bench|long|python'
fi

if [ "${COHORT_TEST_SKIP_TSAN:-0}" != "1" ]; then
  # ThreadSanitizer over the transport and a real server with clients (the bad-input tests).
  # libzmq is not built with TSan: tests/sanitizers/tsan.supp silences reports inside it only.
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOHORT_WITH_CUDA=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DCOHORT_SANITIZE=thread -DCOHORT_BUILD_BENCH=OFF
  cmake --build build-tsan -j "$jobs" --target cohort_transport_tests cohort_transport_security_tests \
    cohort_checkpoint_tests cohort_bad_input_tests cohort-server cohort-client cohort-transport-demo \
    cohort-keygen
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/sanitizers/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure --timeout 900 -j "$ctest_jobs" \
    -R '^(cohort_transport_tests|cohort_transport_security_tests|cohort_checkpoint_tests|cohort_bad_input_tests)$'
fi

if [ "${COHORT_TEST_SKIP_FUZZ:-0}" != "1" ]; then
  # The fuzz targets (clang, libFuzzer) replay the committed corpus, then fuzz 6 s each (CI's
  # 30-minute budget; run tests/fuzz/run.sh 600 for a real session).
  COHORT_FUZZ_SECONDS=${COHORT_FUZZ_SECONDS:-6}
  tests/fuzz/run.sh "$COHORT_FUZZ_SECONDS"
fi
