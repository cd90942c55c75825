#!/usr/bin/env bash
# Served throughput of two cluster layouts in one run: starts `pdserve up`
# with layout A, runs `pdserve bench` against it, stops it, then the same
# with layout B, alternating (ROUNDS rounds, the order within a round
# alternates too), and prints each figure's median per layout and the
# median (min, max) of the per-round ratios B / A. Rates measured minutes
# apart on a shared machine are not comparable; ratios within a round are.
# Besides the bench's figures: cluster_cpu_ms_per_request, the CPU time of
# `up` and its workers during the bench per completed request.
#
#   tools/bench/served_ab.sh BINARY "A_UP_ARGS" "B_UP_ARGS" -- BENCH_ARGS
#   e.g. tools/bench/served_ab.sh build/pdserve \
#          "--mode=colocated --prefill=0 --decode=1" \
#          "--mode=disaggregated --prefill=1 --decode=1" -- \
#          --dataset=fixed --input_len=128 --output_len=128 \
#          --num_prompts=32 --max_concurrency=8
#
# Environment:
#   ROUNDS=3          rounds (each runs both layouts once)
#   UP_ARGS=...       flags for both clusters (model, dtype, quantization)
#   PORT=50151        router port (each cluster in turn)
#   KEEP=DIR          keep every run's JSON and the clusters' output in DIR
#   B_BIN=PATH        run layout B with another binary: an A/B of two builds
#                     (give the same layout twice, e.g. "" "")
#   ALLOW_FAILED=1    keep rounds with failed requests (overload runs, where
#                     what is served in time is the figure: "completed")
set -euo pipefail

usage() {
  sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
[[ $# -ge 4 ]] || usage
BIN=$1
A_UP=$2
B_UP=$3
shift 3
[[ ${1:-} == "--" ]] || usage
shift
B_BIN=${B_BIN:-$BIN}
for b in "$BIN" "$B_BIN"; do
  [[ -x $b ]] || { echo "served_ab.sh: $b is not an executable" >&2; exit 2; }
done
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-50151}
read -r -a COMMON <<<"${UP_ARGS:-}"
OUT=${KEEP:-$(mktemp -d)}
mkdir -p "$OUT"
[[ -n ${KEEP:-} ]] || trap 'rm -rf "$OUT"' EXIT

# CPU time (clock ticks) of `up` and the workers it runs now: a worker that
# exited (and was restarted) during the run is not counted.
cluster_cpu_ticks() {
  local pids=("$1") ticks=0 p stat
  pids+=($(cat /proc/"$1"/task/*/children 2>/dev/null))
  for p in "${pids[@]}"; do
    stat=$(cat /proc/"$p"/stat 2>/dev/null) || continue
    stat=${stat##*) }  # fields after the command name; utime, stime: 12, 13
    read -r -a f <<<"$stat"
    ticks=$((ticks + f[11] + f[12]))
  done
  echo "$ticks"
}

run() {  # run LABEL ROUND "UP_ARGS"
  local label=$1 round=$2 up_args
  read -r -a up_args <<<"$3"
  shift 3
  local log="$OUT/$label.$round.up.log" bin=$BIN
  [[ $label == B ]] && bin=$B_BIN
  "$bin" up --port="$PORT" --http_port=0 "${COMMON[@]}" "${up_args[@]}" \
    >"$log" 2>&1 &
  local up_pid=$!
  for ((i = 0; i < 600; ++i)); do
    grep -q "pdserve up: ready" "$log" && break
    if ! kill -0 "$up_pid" 2>/dev/null; then
      echo "served_ab.sh: $label cluster failed to start:" >&2
      tail -5 "$log" >&2
      exit 1
    fi
    sleep 0.2
  done
  local rc=0 cpu_before
  cpu_before=$(cluster_cpu_ticks "$up_pid")
  "$bin" bench --target="127.0.0.1:$PORT" --json "$@" \
    >"$OUT/$label.$round.json" 2>"$OUT/$label.$round.err" || rc=$?
  echo $(($(cluster_cpu_ticks "$up_pid") - cpu_before)) \
    >"$OUT/$label.$round.cpu"
  kill -TERM "$up_pid"
  wait "$up_pid" || true
  if [[ $rc -ne 0 ]]; then
    echo "served_ab.sh: $label bench $round failed:" >&2
    tail -5 "$OUT/$label.$round.err" >&2
    exit 1
  fi
}

echo "served_ab.sh: $ROUNDS rounds; UP_ARGS=${UP_ARGS:-}"
echo "served_ab.sh: A: $A_UP (binary $BIN)"
echo "served_ab.sh: B: $B_UP (binary $B_BIN)"
echo "served_ab.sh: bench args: $*"
echo "served_ab.sh: load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= ROUNDS; ++r)); do
  if ((r % 2 == 1)); then
    run A "$r" "$A_UP" "$@"
    run B "$r" "$B_UP" "$@"
  else
    run B "$r" "$B_UP" "$@"
    run A "$r" "$A_UP" "$@"
  fi
  echo "served_ab.sh: round $r/$ROUNDS done (load $(cut -d' ' -f1 /proc/loadavg))"
done
echo "served_ab.sh: load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$OUT" "$ROUNDS" "${ALLOW_FAILED:-0}" "$(getconf CLK_TCK)" <<'EOF'
import json, statistics, sys
out, rounds, allow_failed = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
clk_tck = float(sys.argv[4])
keys = ["completed", "output_throughput", "input_throughput",
        "request_throughput"]

def load(label, r):
    j = json.load(open(f"{out}/{label}.{r}.json"))
    m = j.get("metrics", j)
    acc = {k: float(m[k]) for k in keys if k in m}
    for lat in ("ttft_ms", "tpot_ms", "e2e_ms"):
        v = m.get(lat)
        if isinstance(v, dict) and "median" in v:
            acc[f"{lat}.median"] = float(v["median"])
    # The cluster's CPU seconds during the bench, per completed request.
    cpu = float(open(f"{out}/{label}.{r}.cpu").read()) / clk_tck
    if m.get("completed"):
        acc["cluster_cpu_ms_per_request"] = 1000 * cpu / float(m["completed"])
    fails = m.get("failed", m.get("num_failed", 0))
    acc["failed"] = float(fails if isinstance(fails, (int, float)) else 0)
    return acc

A = [load("A", r) for r in range(1, rounds + 1)]
B = [load("B", r) for r in range(1, rounds + 1)]
# A round where either cluster failed requests says nothing about
# throughput: it is reported and left out.
bad = [r + 1 for r in range(rounds)
       if not allow_failed and (A[r]["failed"] or B[r]["failed"])]
if bad:
    print(f"served_ab.sh: rounds {bad} had failed requests "
          f"(A: {[int(A[r - 1]['failed']) for r in bad]}, "
          f"B: {[int(B[r - 1]['failed']) for r in bad]}); left out")
A = [a for r, a in enumerate(A) if r + 1 not in bad]
B = [b for r, b in enumerate(B) if r + 1 not in bad]
if not A:
    sys.exit("served_ab.sh: no round without failures")
w = max(len(k) for k in A[0])
print(f"{'figure':<{w}}  {'A median':>10}  {'B median':>10}  "
      f"{'B/A (median of rounds)':>22}  min..max")
for k in A[0]:
    a = [x[k] for x in A]
    b = [x.get(k, 0.0) for x in B]
    ratios = [y / x for x, y in zip(a, b) if x]
    rs = (f"{statistics.median(ratios):22.3f}  "
          f"{min(ratios):.3f}..{max(ratios):.3f}") if ratios else ""
    print(f"{k:<{w}}  {statistics.median(a):10.4g}  {statistics.median(b):10.4g}"
          f"  {rs}")
EOF
