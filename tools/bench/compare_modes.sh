#!/usr/bin/env bash
# Colocated vs disaggregated serving on the same number of cores.
#
# Starts `pdserve up` twice, one mode at a time, and pins its two worker
# processes to one core each with `taskset -a -cp` (all their threads):
#   disaggregated: 1 prefill worker on core A + 1 decode worker on core B
#   colocated:     2 decode workers (each prefills locally), on cores A and B
# Every worker runs --threads=1. The router and the bench are not pinned.
# Runs the same `mixed` workload (mostly short prompts, some long ones: the
# prefill/decode interference case) against both, prints the two reports and
# a side-by-side table, and writes the plots. Everything it starts is stopped
# by PID on exit (trap EXIT); `pdserve up` stops its own children.
#
# usage: tools/bench/compare_modes.sh            (from the repository root)
# Settings (environment variables, defaults below): PDSERVE MODEL CORES
#   NUM_PROMPTS (0: sweeps only) RATE INPUT_LEN LONG_INPUT_LEN LONG_FRACTION OUTPUT_LEN
#   SLO_TTFT_MS SLO_TPOT_MS SEED KV_CACHE OUT_DIR RESULTS_DIR UP_ARGS
#   SWEEP_RATES (e.g. "0.25,0.5,1": also runs a goodput sweep per mode,
#   SWEEP_PROMPTS requests per rate)
# Outputs: $OUT_DIR/compare_modes.svg (and compare_sweep.svg); the JSON
# results, per-mode plots and cluster logs stay in $RESULTS_DIR.
set -euo pipefail

PDSERVE=${PDSERVE:-build/pdserve}
MODEL=${MODEL:-synthetic:llama-110m}
CORES=${CORES:-"0 1"}
NUM_PROMPTS=${NUM_PROMPTS:-40}
RATE=${RATE:-0.4}
INPUT_LEN=${INPUT_LEN:-64}
LONG_INPUT_LEN=${LONG_INPUT_LEN:-512}
LONG_FRACTION=${LONG_FRACTION:-0.2}
OUTPUT_LEN=${OUTPUT_LEN:-32}
SLO_TTFT_MS=${SLO_TTFT_MS:-5000}
SLO_TPOT_MS=${SLO_TPOT_MS:-100}
SEED=${SEED:-1}
KV_CACHE=${KV_CACHE:-512MiB}
OUT_DIR=${OUT_DIR:-docs/img}
RESULTS_DIR=${RESULTS_DIR:-$(mktemp -d /tmp/pdserve-compare-XXXXXX)}
SWEEP_RATES=${SWEEP_RATES:-}
SWEEP_PROMPTS=${SWEEP_PROMPTS:-20}
UP_ARGS=${UP_ARGS:-}  # extra flags for `pdserve up`

read -r CORE_A CORE_B <<<"$CORES"
mkdir -p "$OUT_DIR" "$RESULTS_DIR"
command -v taskset >/dev/null || { echo "taskset not found (util-linux)" >&2; exit 2; }
[[ -x $PDSERVE ]] || { echo "$PDSERVE not built" >&2; exit 2; }

# shellcheck source=tools/bench/cluster.sh
source "$(dirname "$0")/cluster.sh"
trap up_stop EXIT
trap 'exit 130' INT TERM

# start_cluster MODE -> sets UP_PID and TARGET, pins the two workers.
start_cluster() {
  local mode=$1 port workers log
  port=$(free_port)
  log=$RESULTS_DIR/up-$mode
  if [[ $mode == disaggregated ]]; then workers=(--prefill=1 --decode=1);
  else workers=(--prefill=0 --decode=2); fi
  # shellcheck disable=SC2086  # UP_ARGS is a list of flags
  up_start "$log" --model="$MODEL" --port="$port" --mode="$mode" --threads=1 \
    --kv_cache_memory="$KV_CACHE" "${workers[@]}" $UP_ARGS
  TARGET=127.0.0.1:$port
  # Worker lines: "pdserve up:   decode0   127.0.0.1:41601 (pid 10302) ...".
  mapfile -t pids < <(sed -n 's/^pdserve up: *\(prefill\|decode\)[0-9][0-9]* .*pid \([0-9][0-9]*\).*/\2/p' "$log.out")
  [[ ${#pids[@]} -eq 2 ]] || { echo "expected 2 worker pids, got: ${pids[*]}" >&2; exit 1; }
  taskset -a -cp "$CORE_A" "${pids[0]}" >/dev/null
  taskset -a -cp "$CORE_B" "${pids[1]}" >/dev/null
  echo "== $mode: router $TARGET; worker pids ${pids[0]} -> core $CORE_A, ${pids[1]} -> core $CORE_B" >&2
}

bench() {
  "$PDSERVE" bench --target="$TARGET" --dataset=mixed --seed="$SEED" \
    --input_len="$INPUT_LEN" --long_input_len="$LONG_INPUT_LEN" \
    --long_fraction="$LONG_FRACTION" --output_len="$OUTPUT_LEN" \
    --slo_ttft_ms="$SLO_TTFT_MS" --slo_tpot_ms="$SLO_TPOT_MS" "$@"
}

for mode in colocated disaggregated; do
  start_cluster "$mode"
  # Warm-up (first-touch of weights and KV pages), not measured. Other
  # prompts (another seed), so that the measured ones miss the prefix cache.
  bench --num_prompts=4 --request_rate=inf --progress=false --seed=$((SEED + 1000)) >/dev/null
  if [[ $NUM_PROMPTS -gt 0 ]]; then
    bench --num_prompts="$NUM_PROMPTS" --request_rate="$RATE" --run_label="$mode" \
      --json_out="$RESULTS_DIR/$mode.json" --plot="$RESULTS_DIR/bench-$mode.svg"
  fi
  if [[ -n $SWEEP_RATES ]]; then
    # Sweep point i uses seed SEED+100+i: fresh prompts again.
    bench --seed=$((SEED + 100)) --num_prompts="$SWEEP_PROMPTS" --sweep --request_rates="$SWEEP_RATES" \
      --run_label="$mode" --json_out="$RESULTS_DIR/sweep-$mode.json" \
      --plot="$RESULTS_DIR/sweep-$mode.svg"
  fi
  up_stop
done

echo
if [[ $NUM_PROMPTS -gt 0 ]]; then
  echo "== colocated vs disaggregated ($MODEL, mixed: $NUM_PROMPTS prompts at $RATE req/s," \
    "$INPUT_LEN/$LONG_INPUT_LEN-token prompts ($LONG_FRACTION long), $OUTPUT_LEN output tokens;" \
    "SLO TTFT<=${SLO_TTFT_MS}ms TPOT<=${SLO_TPOT_MS}ms)"
  "$PDSERVE" bench --compare="$RESULTS_DIR/colocated.json,$RESULTS_DIR/disaggregated.json" \
    --plot="$OUT_DIR/compare_modes.svg"
fi
if [[ -n $SWEEP_RATES ]]; then
  "$PDSERVE" bench --compare="$RESULTS_DIR/sweep-colocated.json,$RESULTS_DIR/sweep-disaggregated.json" \
    --plot="$OUT_DIR/compare_sweep.svg"
fi
echo "results: $RESULTS_DIR; plots: $OUT_DIR" >&2
