#!/usr/bin/env bash
# Goodput under overload, with and without the router's admission queue.
# One `pdserve up` per setting, router capped at CAP requests in flight:
#   queue: --admission_queue=4096 (default; requests beyond the cap wait up
#          to --admission_timeout, never past their deadline)
#   none:  --admission_queue=0 (refused at once with RESOURCE_EXHAUSTED and
#          retry-after-ms: the router before the admission queue)
# Capacity = request/s of a closed loop at CAP concurrency (measured on the
# queue cluster); then Poisson arrivals at 1x and 2x capacity, NUM_PROMPTS
# requests each, with an end-to-end SLO. Settings alternate over ROUNDS;
# medians are printed.
#
#   tools/bench/overload_goodput.sh [PDSERVE]
#   CAP=8 NUM_PROMPTS=240 ROUNDS=3 SLO_E2E_MS=3000 INPUT_LEN=128 OUTPUT_LEN=64
#   MODEL=models/stories260K   (environment)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PDSERVE=${1:-$ROOT/build/pdserve}
CAP=${CAP:-8}
NUM_PROMPTS=${NUM_PROMPTS:-240}
ROUNDS=${ROUNDS:-3}
SLO_E2E_MS=${SLO_E2E_MS:-3000}
INPUT_LEN=${INPUT_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-64}
MODEL=${MODEL:-$ROOT/models/stories260K}
source "$ROOT/tools/bench/cluster.sh"
WORK=$(mktemp -d)
trap 'up_stop; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

bench() {  # bench SEED RATE -> "goodput completed failed req/s p99_e2e_ms"
  local seed=$1 rate=$2 out="$WORK/b.json"
  local conc=()
  [ "$rate" = inf ] && conc=(--max_concurrency="$CAP")
  "$PDSERVE" bench --target="127.0.0.1:$PORT" --model="$MODEL" --dataset=random \
    --seed="$seed" --num_prompts="$NUM_PROMPTS" --request_rate="$rate" "${conc[@]}" \
    --input_len="$INPUT_LEN" --output_len="$OUTPUT_LEN" --slo_e2e_ms="$SLO_E2E_MS" \
    --progress=false --json_out="$out" >/dev/null 2>"$WORK/bench.err" ||
    { cat "$WORK/bench.err" >&2; exit 1; }
  python3 - "$out" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
m = j.get("metrics", j)
print(f'{m["goodput"]:.2f} {m["completed"]} {m["failed"]} {m["request_throughput"]:.2f} {m["e2e_ms"].get("p99", 0):.0f}')
PY
}

PORT=$(free_port)
start() {  # start QUEUE
  up_stop
  up_start "$WORK/up" --model="$MODEL" --port="$PORT" \
    --router_args="--max_in_flight=$CAP --admission_queue=$1"
}
start 4096
bench 1 inf >/dev/null  # warm-up
read -r _ _ _ CAPACITY _ <<<"$(bench 2 inf)"
echo "model $MODEL, router --max_in_flight=$CAP; capacity (closed loop at $CAP): $CAPACITY req/s;" \
     "$NUM_PROMPTS requests of $INPUT_LEN in / $OUTPUT_LEN out per run, SLO e2e $SLO_E2E_MS ms;" \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A results
for r in $(seq "$ROUNDS"); do
  for setting in queue none; do
    start "$([ $setting = queue ] && echo 4096 || echo 0)"
    for mult in 1 2; do
      rate=$(python3 -c "print(round($CAPACITY * $mult, 2))")
      results[$setting.$mult]+="$(bench $((100 + r * 10 + mult)) "$rate");"
    done
  done
done
printf '\n| admission | load | goodput req/s (median of %s) | completed / %s | failed | p99 e2e ms |\n| --- | --- | --- | --- | --- | --- |\n' "$ROUNDS" "$NUM_PROMPTS"
for setting in none queue; do
  for mult in 1 2; do
    python3 - "$setting" "$mult" "${results[$setting.$mult]}" <<'PY'
import statistics, sys
setting, mult, raw = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [list(map(float, x.split())) for x in raw.split(";") if x]
med = lambda i: statistics.median(r[i] for r in rows)
name = "queue (--admission_queue=4096)" if setting == "queue" else "none (--admission_queue=0)"
print(f"| {name} | {mult}x | {med(0):.2f} | {med(1):.0f} | {med(2):.0f} | {med(4):.0f} |")
PY
  done
done
