#!/usr/bin/env bash
# Time to first token, disaggregated vs colocated, one request at a time.
#
# For each prompt length (LENGTHS) and each mode, starts `pdserve up`:
#   disaggregated: 1 prefill worker + 1 decode worker (the KV is shipped)
#   colocated:     1 decode worker that prefills itself
# every worker with --threads=$THREADS on the same machine, and sends
# NUM_PROMPTS distinct random prompts of that length (`bench --dataset=fixed`,
# concurrency 1, prefix cache off so each prompt is computed in full), ROUNDS
# times, the modes taking turns (clusters started afresh every round). With the
# KV leaving layer by layer while later layers compute, only the last layer's
# transfer and D's admission are added to TTFT: the ratio disaggregated /
# colocated is what this prints (the median of the per-round ratios). Both
# modes run in the same invocation, alternating, so machine noise hits both.
#
# With B_ARGS set, a third cluster, disaggregated with these extra flags
# (e.g. B_ARGS=--kv_transport=grpc), takes its turn in every round too; its
# ratio to colocated is printed beside the first's, with the per-round
# ratios B / as given: an in-run A/B of a disaggregated setting.
#
# usage: tools/bench/ttft_modes.sh           (from the repository root)
# Settings (environment variables, defaults below): PDSERVE MODEL DTYPE
#   LENGTHS NUM_PROMPTS ROUNDS THREADS KV_CACHE UP_ARGS B_ARGS RESTART
#   RESULTS_DIR
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
B_ARGS=${B_ARGS:-}
RESTART=${RESTART:-1}  # start the clusters afresh every round
MODES=(colocated disaggregated)
[[ -z $B_ARGS ]] || MODES+=(disaggregated_b)
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
  local extra=""
  case $mode in
    disaggregated) workers=(--prefill=1 --decode=1) ;;
    disaggregated_b) workers=(--prefill=1 --decode=1); extra=$B_ARGS ;;
    *) workers=(--prefill=0 --decode=1) ;;
  esac
  # shellcheck disable=SC2086  # UP_ARGS and B_ARGS are lists of flags
  up_start "$log" --model="$MODEL" --dtype="$DTYPE" --port="$port" \
    --mode="${mode%_b}" --threads="$THREADS" --kv_cache_memory="$KV_CACHE" \
    --prefix_caching=false "${workers[@]}" $UP_ARGS $extra
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

# start_all LEN MODE... -> starts and warms up a cluster per mode (TARGETS).
declare -A TARGETS=()
start_all() {
  local len=$1 mode
  shift
  for mode in "$@"; do
    start_cluster "$mode"
    PIDS+=("$UP_PID")
    TARGETS[$mode]=$TARGET
    # Warm-up (first touch of weights and KV pages), not measured.
    "$PDSERVE" bench --target="$TARGET" --dataset=fixed --input_len="$len" \
      --output_len=2 --request_rate=inf --max_concurrency=1 --progress=false \
      --num_prompts=1 --seed=999 >/dev/null
  done
}

declare -A TTFT TAIL RATIO AB
for len in $LENGTHS; do
  # The modes take turns, ROUNDS times, so that the load of this shared
  # machine drifts over all alike, and every round starts its clusters
  # afresh (RESTART=1): on this VM one cluster instance can run 10-15%
  # faster than an identical one for its whole life (where its memory
  # landed), which per-round restarts average out instead of locking in.
  # The ratio is the median of the per-round ratios.
  ((RESTART)) || start_all "$len" "${MODES[@]}"
  declare -A ROUND_TTFT=() ROUND_TAIL=()
  declare -A RATIOS=()
  AB_RATIOS=()
  for round in $(seq "$ROUNDS"); do
    # Every other round the modes go (and start) in reverse order, so that
    # no mode is always the first measured after the clusters warm up.
    order=("${MODES[@]}")
    if ((round % 2 == 0)); then
      order=()
      for ((i = ${#MODES[@]} - 1; i >= 0; i--)); do order+=("${MODES[$i]}"); done
    fi
    ((!RESTART)) || start_all "$len" "${order[@]}"
    declare -A NOW=()  # this round's TTFT per mode
    for mode in "${order[@]}"; do
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
      NOW[$mode]=$ttft
      ROUND_TTFT[$mode]+="$ttft "
      ROUND_TAIL[$mode]+="$tail "
      echo "== $len-token prompts, round $round, $mode: TTFT median ${ttft} ms" >&2
    done
    for mode in "${MODES[@]:1}"; do
      RATIOS[$mode]+="$(python3 -c "print(${NOW[$mode]} / ${NOW[colocated]})") "
    done
    [[ -z $B_ARGS ]] || AB_RATIOS+=("$(python3 -c "print(${NOW[disaggregated_b]} / ${NOW[disaggregated]})")")
    ((!RESTART)) || stop_all
  done
  for mode in "${MODES[@]}"; do
    # shellcheck disable=SC2086  # word lists
    TTFT[$mode-$len]=$(median 1 ${ROUND_TTFT[$mode]})
    # shellcheck disable=SC2086
    TAIL[$mode-$len]=$(median 1 ${ROUND_TAIL[$mode]})
    # shellcheck disable=SC2086
    [[ $mode == colocated ]] || RATIO[$mode-$len]=$(median 3 ${RATIOS[$mode]})
  done
  [[ -z $B_ARGS ]] || AB[$len]="$(median 3 "${AB_RATIOS[@]}") (rounds: $(printf '%.3f ' "${AB_RATIOS[@]}"))"
  stop_all
done

echo
echo "TTFT, one request at a time ($MODEL $DTYPE, --threads=$THREADS per worker, $ROUNDS rounds of $NUM_PROMPTS prompts per mode, modes alternating; medians)"
printf '%-8s %-16s %16s %16s %8s %22s\n' tokens disaggregated "colocated (ms)" "disagg. (ms)" ratio "KV transfer tail (ms)"
for len in $LENGTHS; do
  for mode in "${MODES[@]:1}"; do
    label="as given"
    [[ $mode == disaggregated ]] || label=$B_ARGS
    printf '%-8s %-16s %16s %16s %8s %22s\n' "$len" "$label" \
      "${TTFT[colocated-$len]}" "${TTFT[$mode-$len]}" "${RATIO[$mode-$len]}" \
      "${TAIL[$mode-$len]}"
  done
done
if [[ -n $B_ARGS ]]; then
  for len in $LENGTHS; do
    echo "$len tokens: TTFT with $B_ARGS / as given, median of per-round ratios: ${AB[$len]}"
  done
fi
echo "(results in $RESULTS_DIR)"
