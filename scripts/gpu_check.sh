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
# PROFILE=1 (A/B of decode at context, AB_ROUNDS rounds), NCU=1 (kernel
# times under ncu), BENCH_RUN=0 (skip the benchmark), SANITIZE=0,
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
  export PATH=$PATH:$R/usr/bin  # the system's tools first (the carried cmake needs libarchive)
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
# CudaDevice.ProbesFailCleanlyWithoutDevice skips by design where a GPU is.
if grep "Skipped" "$OUT_DIR/ctest.log" | grep -qv ProbesFailCleanlyWithoutDevice; then
  echo "NOTE: some tests were SKIPPED (no usable GPU?) — not a GPU verification"
  if [ "$TEST_RC" -eq 0 ]; then TEST_RC=4; fi
fi

if [ -n "${PROFILE:-}" ]; then
  # Where a decode step's time goes: the step at growing context (attention's
  # share) as an A/B of the split-along-keys decode attention against the
  # unsplit kernel (PDSERVE_CUDA_ATTENTION_SPLIT=0), alternating AB_ROUNDS
  # rounds in this run; with NCU=1 also a tiny model's step (fixed
  # per-step cost: launches, host work) and each kernel's device time.
  # AB_SPLITS: the PDSERVE_CUDA_ATTENTION_SPLIT values to alternate (keys
  # per split; 0 = unsplit); AB_ARGS: the bench-engine flags of each run.
  read -r -a SPLITS <<< "${AB_SPLITS:-0 default}"
  AB_ARGS=${AB_ARGS:---prompt_len=16 --gen_len=16 --batch=1 --decode_contexts=16,512,2048 --context_steps=32}
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for split in "${SPLITS[@]}"; do
      step "profile round $round, PDSERVE_CUDA_ATTENTION_SPLIT=$split: llama3-8b bf16 $AB_ARGS"
      # shellcheck disable=SC2086
      PDSERVE_CUDA_ATTENTION_SPLIT=$split "$BUILD/pdserve" bench-engine \
        --device=cuda --model=synthetic:llama3-8b --dtype=bf16 $AB_ARGS \
        2>/dev/null | tee "$OUT_DIR/ab_${split}_${round}.txt" | grep -E "^(decode|prefill)"
    done
  done
fi
if [ "${NCU:-0}" != 0 ]; then
  step "profile: fixed per-step cost (synthetic:llama-110m, bf16, batch 1 and 64)"
  "$BUILD/pdserve" bench-engine --device=cuda --model=synthetic:llama-110m \
    --dtype=bf16 --prompt_len=512 --gen_len=64 --batch=1,64 | tee "$OUT_DIR/small.txt"
  NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -n "$NCU_BIN" ]; then
    step "profile: ncu kernel times (llama3-8b, prompt 512, 3 decode steps)"
    timeout 240 "$NCU_BIN" --clock-control none --print-units base --metrics gpu__time_duration.sum \
      --csv --log-file "$OUT_DIR/ncu.csv" "$BUILD/pdserve" bench-engine \
      --device=cuda --model=synthetic:llama3-8b --dtype=bf16 --prompt_len=512 \
      --gen_len=3 --batch=1 > "$OUT_DIR/ncu_bench.txt" 2>&1
    echo "ncu rc=$?"
    python3 - "$OUT_DIR/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; rows = rows[1:]
name = head.index("Kernel Name"); val = head.index("Metric Value")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows:
    try: v = float(r[val].replace(",", ""))
    except ValueError: continue
    tot[r[name][:90]] += v; cnt[r[name][:90]] += 1
print("kernels:", len(rows), " total ms:", sum(tot.values()) / 1e6)
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:25]:
    print(f"{v/1e6:10.3f} ms  {cnt[k]:6d}x  {v/cnt[k]/1e3:9.1f} us  {k}")
PY
  fi
fi

step "benchmark"
BENCH=("$BUILD/pdserve" bench-engine --device=cuda --model=synthetic:llama3-8b
       --dtype=bf16 --prompt_len="$PREFILL_LEN" --gen_len="$GEN_LEN" --batch=1,8,64)
echo "command: ${BENCH[*]}"
BENCH_RC=skipped
if [ "${BENCH_RUN:-1}" != 0 ]; then
  "${BENCH[@]}" | tee "$OUT_DIR/bench.txt"
  BENCH_RC=${PIPESTATUS[0]}
fi

# Out-of-bounds accesses and races the tests' results would not show
# (compute-sanitizer runs where the runtime allows it: Firecracker, not
# gVisor). Reported, not counted in the exit status: a refusal by the
# runtime is not a defect of ours.
SAN_RC=skipped
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -n "${SANITIZE:-1}" ] && [ "${SANITIZE:-1}" != 0 ] && [ -n "$SANITIZER" ]; then
  step "compute-sanitizer memcheck (kernel and runner tests)"
  SAN_RC=0
  for t in cuda_kernels_test cuda_runner_test; do
    timeout 150 "$SANITIZER" --tool memcheck --error-exitcode 9 \
      "$BUILD/tests/$t" --gtest_brief=1 2>&1 | tail -25 | tee -a "$OUT_DIR/sanitizer.log"
    rc=${PIPESTATUS[0]}
    echo "$t under memcheck: rc=$rc"
    [ "$rc" -eq 0 ] || SAN_RC=$rc
  done
fi

step "summary"
echo "tests rc=$TEST_RC  bench rc=$BENCH_RC  sanitizer rc=$SAN_RC  (outputs in $OUT_DIR)"
[ "$TEST_RC" -eq 0 ] || exit 4
[ "$BENCH_RC" = skipped ] || [ "$BENCH_RC" -eq 0 ] || exit 5
exit 0
