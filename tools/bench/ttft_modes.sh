#!/usr/bin/env bash
# Time to first token, disaggregated vs colocated, one request at a time.
#
# For each prompt length (LENGTHS) and each mode, starts `pdserve up`:
#   disaggregated: 1 prefill worker + 1 decode worker (the KV is shipped)
#   colocated:     1 decode worker that prefills itself
# every worker with --threads=$THREADS on the same machine, and sends
# NUM_PROMPTS distinct random prompts of that length (`bench --dataset=fixed`,
# concurrency 1, prefix cache off so each prompt is computed in full), ROUNDS
# times, the two modes' clusters up together and taking turns. With the
# KV leaving layer by layer while later layers compute, only the last layer's
# transfer and D's admission are added to TTFT: the ratio disaggregated /
# colocated is what this prints (the median of the per-round ratios). Both
# modes run in the same invocation, alternating, so machine noise hits both.
#
# usage: tools/bench/ttft_modes.sh           (from the repository root)
# Settings (environment variables, defaults below): PDSERVE MODEL DTYPE
#   LENGTHS NUM_PROMPTS ROUNDS THREADS KV_CACHE UP_ARGS RESULTS_DIR
# Everything it starts is stopped by PID on exit.
set -euo pipefail

PDSERVE=${PDSERVE:-build/pdserve}
MODEL=${MODEL:-synthetic:llama-110m}
DTYPE=${DTYPE:-f32}
LENGTHS=${LENGTHS:-"512 2046"}  # prompt + 2 output tokens <= the 2048 context
NUM_PROMPTS=${NUM_PROMPTS:-5}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
KV_CACHE=${KV_CACHE:-1GiB}
UP_ARGS=${UP_ARGS:-}
RESULTS_DIR=${RESULTS_DIR:-$(mktemp -d /tmp/pdserve-ttft-XXXXXX)}

[[ -x $PDSERVE ]] || { echo "$PDSERVE not built" >&2; exit 2; }
mkdir -p "$RESULTS_DIR"

# shellcheck source=tools/bench/cluster.sh
source "$(dirname "$0")/cluster.sh"
PIDS=()
stop_all() {
  for pid in "${PIDS[@]}"; do UP_PID=$pid; up_stop; done
  PIDS=()
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# start_cluster MODE -> sets UP_PID and TARGET.
start_cluster() {
  local mode=$1 port workers log
  port=$(free_port)
  log=$RESULTS_DIR/up-$mode
  if [[ $mode == disaggregated ]]; then workers=(--prefill=1 --decode=1);
  else workers=(--prefill=0 --decode=1); fi
  # shellcheck disable=SC2086  # UP_ARGS is a list of flags
  up_start "$log" --model="$MODEL" --dtype="$DTYPE" --port="$port" --mode="$mode" \
    --threads="$THREADS" --kv_cache_memory="$KV_CACHE" --prefix_caching=false \
    "${workers[@]}" $UP_ARGS
  TARGET=127.0.0.1:$port
}

# median TTFT (ms) and mean KV-transfer tail (ms) of a bench JSON.
summary() {
  python3 - "$1" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
m = j.get("metrics", j)
tail = m.get("stage_ms", {}).get("kv_transfer_tail", {}).get("mean", 0.0)
print(f'{m["ttft_ms"]["median"]:.1f} {tail:.1f} {m["failed"]}')
EOF
}

# median DIGITS VALUES...: their median, DIGITS decimals.
median() {
  python3 -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[2:])):.{sys.argv[1]}f}')" "$@"
}

declare -A TTFT TAIL RATIO
for len in $LENGTHS; do
  # Both clusters stay up; the modes then take turns, ROUNDS times, so that
  # the load of this shared machine drifts over both alike. The ratio is the
  # median of the per-round ratios.
  declare -A TARGETS=()
  for mode in colocated disaggregated; do
    start_cluster "$mode"
    PIDS+=("$UP_PID")
    TARGETS[$mode]=$TARGET
    # Warm-up (first touch of weights and KV pages), not measured.
    "$PDSERVE" bench --target="$TARGET" --dataset=fixed --input_len="$len" \
      --output_len=2 --request_rate=inf --max_concurrency=1 --progress=false \
      --num_prompts=1 --seed=999 >/dev/null
  done
  declare -A ROUND_TTFT=() ROUND_TAIL=()
  ratios=()
  for round in $(seq "$ROUNDS"); do
    for mode in colocated disaggregated; do
      out=$RESULTS_DIR/$mode-$len-r$round
      "$PDSERVE" bench --target="${TARGETS[$mode]}" --dataset=fixed \
        --input_len="$len" --output_len=2 --request_rate=inf --max_concurrency=1 \
        --progress=false --num_prompts="$NUM_PROMPTS" --seed="$round" \
        --json_out="$out.json" >"$out.txt"
      read -r ttft tail failed < <(summary "$out.json")
      # A request can fail on a loaded machine (a worker busy with a long
      # prefill misses the router's health polls); the median is then of
      # the others, and the failure is reported.
      [[ $failed == 0 ]] || echo "warning: $failed requests failed ($mode, $len tokens, round $round): see $out.txt" >&2
      ROUND_TTFT[$mode]+="$ttft "
      ROUND_TAIL[$mode]+="$tail "
      echo "== $len-token prompts, round $round, $mode: TTFT median ${ttft} ms" >&2
    done
    colocated=$(echo "${ROUND_TTFT[colocated]}" | awk '{print $NF}')
    ratios+=("$(python3 -c "print($ttft / $colocated)")")
  done
  # shellcheck disable=SC2086  # word lists
  TTFT[colocated-$len]=$(median 1 ${ROUND_TTFT[colocated]})
  # shellcheck disable=SC2086
  TTFT[disaggregated-$len]=$(median 1 ${ROUND_TTFT[disaggregated]})
  # shellcheck disable=SC2086
  TAIL[disaggregated-$len]=$(median 1 ${ROUND_TAIL[disaggregated]})
  RATIO[$len]=$(median 3 "${ratios[@]}")
  stop_all
done

echo
echo "TTFT, one request at a time ($MODEL $DTYPE, --threads=$THREADS per worker, $ROUNDS rounds of $NUM_PROMPTS prompts per mode, modes alternating; medians)"
printf '%-8s %16s %16s %8s %22s\n' tokens "colocated (ms)" "disagg. (ms)" ratio "KV transfer tail (ms)"
for len in $LENGTHS; do
  printf '%-8s %16s %16s %8s %22s\n' "$len" "${TTFT[colocated-$len]}" \
    "${TTFT[disaggregated-$len]}" "${RATIO[$len]}" "${TAIL[disaggregated-$len]}"
done
echo "(results in $RESULTS_DIR)"
