#!/usr/bin/env bash
# A/B of how long a prefill worker's forward passes spend sealing KV chunks
# for their pushes (pdserve_prefill_kv_export_seconds, per pass), with an
# environment switch of one binary: side A runs with A_ENV, side B with
# B_ENV (default: PDSERVE_KV_EXPORT_PARALLEL=0 against the default, i.e.
# chunks sealed on one thread against all compute threads). Each round
# starts a fresh disaggregated `pdserve up` per side (sides alternate),
# warms it up, sends NUM_PROMPTS prompts of INPUT_LEN tokens at CONCURRENCY
# (several prompts per pass when CONCURRENCY > 1) and reads the histogram
# from the prefill worker's /metrics before and after. Prints each round and
# the medians: export ms per pass per side, B/A, and TTFT median B/A.
#
#   ROUNDS=5 tools/bench/kv_export_ab.sh
#   CONCURRENCY=1 INPUT_LEN=2046 NUM_PROMPTS=3 tools/bench/kv_export_ab.sh
set -euo pipefail

PDSERVE=${PDSERVE:-build/pdserve}
MODEL=${MODEL:-synthetic:llama-110m}
DTYPE=${DTYPE:-f32}
THREADS=${THREADS:-2}
INPUT_LEN=${INPUT_LEN:-512}
CONCURRENCY=${CONCURRENCY:-8}
NUM_PROMPTS=${NUM_PROMPTS:-32}
ROUNDS=${ROUNDS:-5}
KV_CACHE=${KV_CACHE:-2GiB}
A_ENV=${A_ENV:-PDSERVE_KV_EXPORT_PARALLEL=0}
B_ENV=${B_ENV:-}
RESULTS_DIR=${RESULTS_DIR:-$(mktemp -d /tmp/pdserve-kv-export-XXXXXX)}

[[ -x $PDSERVE ]] || { echo "$PDSERVE not built" >&2; exit 2; }
mkdir -p "$RESULTS_DIR"
# shellcheck source=tools/bench/cluster.sh
source "$(dirname "$0")/cluster.sh"
trap up_stop EXIT
trap 'exit 130' INT TERM

# Sum and count of the prefill worker's export histogram.
export_sum_count() {
  curl -sf "http://$1/metrics" | awk '
    /^pdserve_prefill_kv_export_seconds_sum/ {s=$2}
    /^pdserve_prefill_kv_export_seconds_count/ {c=$2}
    END {print s, c}'
}

bench() {
  "$PDSERVE" bench --target="$1" --dataset=fixed --input_len="$INPUT_LEN" \
    --output_len=2 --request_rate=inf --max_concurrency="$CONCURRENCY" \
    --progress=false --num_prompts="$2" --seed="$3" --json_out="$4" \
    >"$4.txt" 2>&1 || { cat "$4.txt" >&2; exit 1; }
}

# run_side SIDE ENV -> writes "export_ms_per_pass ttft_median_ms" to
# $RESULTS_DIR/SIDE-rROUND.txt (in this shell, so that the EXIT trap stops
# the cluster it started).
run_side() {
  local side=$1 env=$2 port log metrics before after
  port=$(free_port)
  log=$RESULTS_DIR/up-$side
  # The cluster's processes inherit the side's variables (VAR=value words).
  # shellcheck disable=SC2086,SC2163
  [[ -z $env ]] || export $env
  up_start "$log" --model="$MODEL" --dtype="$DTYPE" --port="$port" \
    --mode=disaggregated --threads="$THREADS" --kv_cache_memory="$KV_CACHE" \
    --prefix_caching=false --prefill=1 --decode=1
  for word in $env; do unset "${word%%=*}"; done
  metrics=$(grep "prefill0" "$log.out" | grep -o "metrics [0-9.:]*" | cut -d' ' -f2)
  bench "127.0.0.1:$port" "$CONCURRENCY" 999 "$RESULTS_DIR/warmup.json"
  before=$(export_sum_count "$metrics")
  bench "127.0.0.1:$port" "$NUM_PROMPTS" 1 "$RESULTS_DIR/$side-r$round.json"
  after=$(export_sum_count "$metrics")
  up_stop
  python3 - "$before" "$after" "$RESULTS_DIR/$side-r$round.json" \
    >"$RESULTS_DIR/$side-r$round.txt" <<'EOF'
import json, sys
s0, c0 = map(float, sys.argv[1].split())
s1, c1 = map(float, sys.argv[2].split())
j = json.load(open(sys.argv[3]))
m = j.get("metrics", j)
ttft = m["ttft_ms"]["median"]
print(f"{(s1 - s0) / max(c1 - c0, 1) * 1e3:.3f} {ttft:.1f}")
EOF
}

declare -a EA EB TA TB
for round in $(seq "$ROUNDS"); do
  run_side A "$A_ENV"
  run_side B "$B_ENV"
  read -r ea ta <"$RESULTS_DIR/A-r$round.txt"
  read -r eb tb <"$RESULTS_DIR/B-r$round.txt"
  EA+=("$ea"); EB+=("$eb"); TA+=("$ta"); TB+=("$tb")
  echo "round $round: export ms/pass A ($A_ENV) $ea, B (${B_ENV:-defaults}) $eb; TTFT median A $ta ms, B $tb ms"
done

python3 - "${EA[*]}" "${EB[*]}" "${TA[*]}" "${TB[*]}" <<'EOF'
import statistics, sys
ea, eb, ta, tb = ([float(x) for x in a.split()] for a in sys.argv[1:5])
med = statistics.median
print(f"export ms per pass (medians of {len(ea)} rounds): A {med(ea):.2f}, "
      f"B {med(eb):.2f}, B/A per round median "
      f"{med([b / a for a, b in zip(ea, eb)]):.3f}")
print(f"TTFT median ms: A {med(ta):.1f}, B {med(tb):.1f}, B/A per round median "
      f"{med([b / a for a, b in zip(ta, tb)]):.3f}")
EOF
echo "(results in $RESULTS_DIR)"
