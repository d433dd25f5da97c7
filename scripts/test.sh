#!/usr/bin/env bash
# Installs what the build needs, builds Cohort (Release, CUDA when nvcc is found), runs every test
# with CTest, installs it and runs examples/custom_aggregator against the installed package, then
# rebuilds the wire-facing tests under AddressSanitizer + UBSan and runs them.
# Usage: ./scripts/test.sh            (what CI runs)
#        COHORT_TEST_SKIP_ASAN=1 ./scripts/test.sh   (faster local loop)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/install-deps.sh

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOHORT_WITH_CUDA=AUTO
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure --timeout 600 -j 1

# The installed package as a user meets it: cmake --install into build/install, then
# examples/custom_aggregator (its own CMake project, find_package(Cohort)) built against it in
# build/custom_aggregator, and a short federation with its rule as a plug-in and embedded.
rm -rf build/install build/custom_aggregator
cmake --install build --prefix build/install
examples/custom_aggregator/run.sh --prefix build/install --build build/custom_aggregator

if [ "${COHORT_TEST_SKIP_ASAN:-0}" != "1" ]; then
  # Malformed input must never crash a node: the decoder and transport tests again, sanitized.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOHORT_WITH_CUDA=OFF \
    -DCOHORT_SANITIZE=address,undefined -DCOHORT_BUILD_BENCH=OFF
  cmake --build build-asan -j "$jobs" --target cohort_core_tests cohort_transport_tests \
    cohort_transport_security_tests cohort-transport-demo cohort-keygen
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure --timeout 600 \
    -R '^(cohort_core_tests|cohort_transport_tests|cohort_transport_security_tests)$'
fi
