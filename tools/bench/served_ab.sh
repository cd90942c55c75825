#!/usr/bin/env bash
# Served throughput of two cluster layouts in one run: starts `pdserve up`
# with layout A, runs `pdserve bench` against it, stops it, then the same
# with layout B, alternating (ROUNDS rounds, the order within a round
# alternates too), and prints each figure's median per layout and the
# median (min, max) of the per-round ratios B / A. Rates measured minutes
# apart on a shared machine are not comparable; ratios within a round are.
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
set -euo pipefail

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
[[ $# -ge 4 ]] || usage
BIN=$1
A_UP=$2
B_UP=$3
shift 3
[[ ${1:-} == "--" ]] || usage
shift
[[ -x $BIN ]] || { echo "served_ab.sh: $BIN is not an executable" >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-50151}
read -r -a COMMON <<<"${UP_ARGS:-}"
OUT=${KEEP:-$(mktemp -d)}
mkdir -p "$OUT"
[[ -n ${KEEP:-} ]] || trap 'rm -rf "$OUT"' EXIT

run() {  # run LABEL ROUND "UP_ARGS"
  local label=$1 round=$2 up_args
  read -r -a up_args <<<"$3"
  shift 3
  local log="$OUT/$label.$round.up.log"
  "$BIN" up --port="$PORT" --http_port=0 "${COMMON[@]}" "${up_args[@]}" \
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
  local rc=0
  "$BIN" bench --target="127.0.0.1:$PORT" --json "$@" \
    >"$OUT/$label.$round.json" 2>"$OUT/$label.$round.err" || rc=$?
  kill -TERM "$up_pid"
  wait "$up_pid" || true
  if [[ $rc -ne 0 ]]; then
    echo "served_ab.sh: $label bench $round failed:" >&2
    tail -5 "$OUT/$label.$round.err" >&2
    exit 1
  fi
}

echo "served_ab.sh: $ROUNDS rounds; UP_ARGS=${UP_ARGS:-}"
echo "served_ab.sh: A: $A_UP"
echo "served_ab.sh: B: $B_UP"
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

python3 - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
keys = ["output_throughput", "input_throughput", "request_throughput"]

def load(label, r):
    j = json.load(open(f"{out}/{label}.{r}.json"))
    m = j.get("metrics", j)
    acc = {k: float(m[k]) for k in keys if k in m}
    for lat in ("ttft_ms", "tpot_ms", "e2e_ms"):
        v = m.get(lat)
        if isinstance(v, dict) and "median" in v:
            acc[f"{lat}.median"] = float(v["median"])
    fails = m.get("failed", m.get("num_failed", 0))
    acc["failed"] = float(fails if isinstance(fails, (int, float)) else 0)
    return acc

A = [load("A", r) for r in range(1, rounds + 1)]
B = [load("B", r) for r in range(1, rounds + 1)]
# A round where either cluster failed requests says nothing about
# throughput: it is reported and left out.
bad = [r + 1 for r in range(rounds) if A[r]["failed"] or B[r]["failed"]]
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
