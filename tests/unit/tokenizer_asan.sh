#!/bin/sh
# Builds ONLY tokenizer_fuzz_test with AddressSanitizer + UBSan in its own
# build tree and runs it (CTest: tokenizer_fuzz_asan, label "asan").
# Usage: tokenizer_asan.sh SOURCE_DIR BUILD_DIR
set -eu
src="$1"
build="$2"
jobs="${PDSERVE_ASAN_JOBS:-2}"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPDSERVE_ASAN=ON -DPDSERVE_WITH_GRPC=OFF -DPDSERVE_CUDA=OFF >/dev/null
fi
cmake --build "$build" --target tokenizer_fuzz_test -j "$jobs"
cd "$src"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$build/tests/tokenizer_fuzz_test" --gtest_brief=1
