#!/bin/sh
# Builds ONLY the given test target with AddressSanitizer + UBSan in its own
# build tree and runs it (CTest: tokenizer_fuzz_asan, chat_template_fuzz_asan;
# label "asan"). Tests sharing a build tree must not run concurrently (the
# CTest registrations hold the RESOURCE_LOCK "asan_build").
# Usage: asan_test.sh SOURCE_DIR BUILD_DIR TARGET [TEST ARGS...]
set -eu
src="$1"
build="$2"
target="$3"
shift 3
jobs="${PDSERVE_ASAN_JOBS:-2}"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPDSERVE_ASAN=ON -DPDSERVE_WITH_GRPC=OFF -DPDSERVE_CUDA=OFF >/dev/null
fi
cmake --build "$build" --target "$target" -j "$jobs"
cd "$src"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$build/tests/$target" --gtest_brief=1 "$@"
