#!/usr/bin/env bash
# The one script a GPU session runs on the device machine (repository root,
# 16 cores, no network, no apt, no gRPC): builds the engine alone with the
# CUDA backend, runs the CUDA tests (ctest -L gpu, plus the no-GPU error
# test), then `pdserve bench-engine --device=cuda` on synthetic:llama3-8b in
# bf16. Everything it prints also goes to $OUT (or build-gpu-out/).
#   run(command="scripts/gpu_check.sh", carry=["build-gpu-debs"], timeout_s=590)
# build-gpu-debs/ comes from scripts/fetch_gpu_debs.sh (run it here first);
# its packages are used only when the machine lacks a dependency.
# Exit: 0 all good; 2 missing dependency; 3 configure/build failed; 4 tests
# failed or skipped on a GPU machine; 5 benchmark failed.
# Knobs (env): JOBS, BUILD_DIR, PREFILL_LEN, GEN_LEN, CUDA_ARCH, NVCC,
# FORCE_DEBS=1 (use the carried packages even if the system has them),
# CONFIGURE_ONLY=1 (stop after configure: to check the packages here).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT_DIR=$PWD
OUT_DIR=${OUT:-$ROOT_DIR/build-gpu-out}
mkdir -p "$OUT_DIR"
exec > >(tee "$OUT_DIR/gpu_check.log") 2>&1
JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD_DIR:-build-gpu}
PREFILL_LEN=${PREFILL_LEN:-512}
GEN_LEN=${GEN_LEN:-128}
step() { echo; echo "=== $(date -u +%H:%M:%S) $*"; }

step "machine"
uname -a
(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv) || echo "nvidia-smi: not found"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ]; then echo "MISSING: nvcc (CUDA toolkit) — cannot build the CUDA backend"; exit 2; fi
"$NVCC" --version | tail -2
ls "$(dirname "$NVCC")/../lib64" 2>/dev/null | grep -E '^lib(cudart|cublas|cublasLt)\.so$' || echo "WARNING: cudart/cublas not found next to nvcc"
g++ --version | head -1 || { echo "MISSING: g++"; exit 2; }
echo "cores: $(nproc)"

# ---- Dependencies: report what the system has; fall back to the carried debs.
have_cmake_pkg() {  # name of a <Name>Config.cmake / <name>-config.cmake
  find ${CARRIED_ROOT:+$CARRIED_ROOT/usr/lib $CARRIED_ROOT/usr/share} \
    /usr/lib /usr/share /usr/local/lib /usr/local/share /usr/lib64 -maxdepth 4 \
    \( -iname "$1Config.cmake" -o -iname "$1-config.cmake" \) 2>/dev/null | head -1
}
have_pc() { command -v pkg-config >/dev/null && pkg-config --exists "$1" && echo "pkg-config $1 $(pkg-config --modversion "$1")"; }
check_system() {
  local missing=()
  local cm; cm=$(command -v cmake && cmake --version | head -1)
  if [ -z "$cm" ]; then missing+=(cmake); fi
  echo "  cmake:        ${cm:-missing}"
  echo "  ninja:        $(command -v ninja || echo 'missing (make is used)')"
  echo "  pkg-config:   $(command -v pkg-config || echo missing)"
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  local f
  f=$(have_cmake_pkg absl); echo "  absl:         ${f:-missing}"; [ -n "$f" ] || missing+=(absl)
  f=$(have_cmake_pkg nlohmann_json); echo "  nlohmann_json:${f:-missing}"; [ -n "$f" ] || missing+=(nlohmann_json)
  f=$(have_cmake_pkg GTest); echo "  gtest:        ${f:-missing}"; [ -n "$f" ] || missing+=(gtest)
  f=$(have_pc libpcre2-8); echo "  pcre2:        ${f:-missing}"; [ -n "$f" ] || missing+=(pcre2)
  f=$(have_pc libutf8proc); echo "  utf8proc:     ${f:-missing}"; [ -n "$f" ] || missing+=(utf8proc)
  f=$(have_pc libxxhash); echo "  xxhash:       ${f:-missing}"; [ -n "$f" ] || missing+=(xxhash)
  f=$(have_cmake_pkg dnnl); echo "  dnnl:         ${f:-absent (optional: CPU GEMM probe only)}"
  MISSING=("${missing[@]}")
}
step "dependencies (system)"
check_system
if [ ${#MISSING[@]} -gt 0 ] || [ -n "${FORCE_DEBS:-}" ]; then
  echo "system lacks: ${MISSING[*]:-nothing (FORCE_DEBS set)}"
  DEBS=$ROOT_DIR/build-gpu-debs
  if ! ls "$DEBS"/*.deb >/dev/null 2>&1; then
    echo "FAILED: missing dependencies and no carried packages in build-gpu-debs/."
    echo "Run scripts/fetch_gpu_debs.sh where apt works and carry build-gpu-debs."
    exit 2
  fi
  step "extracting carried packages into build-gpu-root"
  R=$ROOT_DIR/build-gpu-root  # outside build-gpu-debs: keeps the carry small
  CARRIED_ROOT=$R
  rm -rf "$R" && mkdir -p "$R"
  for d in "$DEBS"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$d" "$R"
    else  # ar + tar: a .deb is an ar archive holding data.tar.*
      (tmp=$(mktemp -d) && cd "$tmp" && ar x "$d" && tar -xf data.tar.* -C "$R" && rm -rf "$tmp")
    fi || { echo "FAILED to extract $d"; exit 2; }
  done
  # pkg-config files name prefix=/usr: point them at the extracted tree.
  find "$R" -name '*.pc' -exec sed -i "s|^prefix=/usr|prefix=$R/usr|" {} +
  ML=x86_64-linux-gnu
  export PATH=$R/usr/bin:$PATH
  export CMAKE_PREFIX_PATH=$R/usr:$R/usr/lib/$ML/cmake${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export PKG_CONFIG_PATH=$R/usr/lib/$ML/pkgconfig:$R/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$R/usr/lib/$ML${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  step "dependencies (with carried packages)"
  check_system
  if [ ${#MISSING[@]} -gt 0 ]; then echo "FAILED: still missing ${MISSING[*]}"; exit 2; fi
fi

step "configure (engine alone, CUDA ON)"
GEN=Ninja; command -v ninja >/dev/null || GEN="Unix Makefiles"
cmake -S . -B "$BUILD" -G "$GEN" -DCMAKE_BUILD_TYPE=Release \
  -DPDSERVE_WITH_GRPC=OFF -DPDSERVE_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" \
  ${CUDA_ARCH:+-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH} || { echo "FAILED: configure"; exit 3; }
grep -E '^(absl|GTest|nlohmann_json)_DIR' "$BUILD/CMakeCache.txt"
[ -z "${CONFIGURE_ONLY:-}" ] || exit 0
step "build (-j$JOBS)"
cmake --build "$BUILD" -j"$JOBS" --target pdserve cuda_device_test \
  cuda_kernels_test cuda_runner_test || { echo "FAILED: build"; exit 3; }

step "tests: ctest -L 'gpu|cuda'"
(cd "$BUILD" && ctest -L 'gpu|cuda' --output-on-failure --timeout 300) \
  | tee "$OUT_DIR/ctest.log"
TEST_RC=${PIPESTATUS[0]}
if grep -q "Skipped" "$OUT_DIR/ctest.log"; then
  echo "NOTE: some tests were SKIPPED (no usable GPU?) — not a GPU verification"
  if [ "$TEST_RC" -eq 0 ]; then TEST_RC=4; fi
fi

step "benchmark"
BENCH=("$BUILD/pdserve" bench-engine --device=cuda --model=synthetic:llama3-8b
       --dtype=bf16 --prompt_len="$PREFILL_LEN" --gen_len="$GEN_LEN" --batch=1,8,64)
echo "command: ${BENCH[*]}"
"${BENCH[@]}" | tee "$OUT_DIR/bench.txt"
BENCH_RC=${PIPESTATUS[0]}

step "summary"
echo "tests rc=$TEST_RC  bench rc=$BENCH_RC  (outputs in $OUT_DIR)"
[ "$TEST_RC" -eq 0 ] || exit 4
[ "$BENCH_RC" -eq 0 ] || exit 5
exit 0
