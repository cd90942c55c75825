#!/usr/bin/env bash
# gRPC vs the OpenAI HTTP API on one cluster: alternates `pdserve bench` over
# gRPC (--target) and over HTTP (--backend=openai) for ROUNDS rounds against
# one `pdserve up`, each run with its own seed (no prefix-cache reuse between
# runs; the order flips every round), and prints each run's output tok/s and
# request/s, then the median per-round ratio HTTP / gRPC.
#
#   tools/bench/api_ab.sh [PDSERVE]       (default build/pdserve)
#   ROUNDS=5 NUM_PROMPTS=256 CONCURRENCY=16 INPUT_LEN=128 OUTPUT_LEN=64
#   MODEL=models/stories260K UP_ARGS="--decode=1"   (environment)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PDSERVE=${1:-$ROOT/build/pdserve}
ROUNDS=${ROUNDS:-5}
NUM_PROMPTS=${NUM_PROMPTS:-256}
CONCURRENCY=${CONCURRENCY:-16}
INPUT_LEN=${INPUT_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-64}
MODEL=${MODEL:-$ROOT/models/stories260K}
UP_ARGS=${UP_ARGS:-}
source "$ROOT/tools/bench/cluster.sh"
WORK=$(mktemp -d)
trap 'up_stop; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

PORT=$(free_port)
# shellcheck disable=SC2086
up_start "$WORK/up" --model="$MODEL" --port="$PORT" --http_port=-1 $UP_ARGS
HTTP=$(sed -n 's|.*HTTP API on \(http://[0-9.:]*/v1\).*|\1|p' "$WORK/up.out")
[ -n "$HTTP" ] || { echo "no HTTP URL in up's output" >&2; exit 1; }
echo "cluster: $MODEL, up $UP_ARGS; gRPC 127.0.0.1:$PORT, HTTP $HTTP"
echo "each run: $NUM_PROMPTS requests, $CONCURRENCY concurrent, random $INPUT_LEN in / $OUTPUT_LEN out, stop_at_eos off; load average $(cut -d' ' -f1-3 /proc/loadavg)"

run() {  # run API SEED -> "output_tok/s request/s completed failed"
  local api=$1 seed=$2 out="$WORK/$1-$2.json"
  local target=(--target="127.0.0.1:$PORT")
  [ "$api" = http ] && target=(--backend=openai --base_url="$HTTP" --tokenizer="$MODEL")
  "$PDSERVE" bench "${target[@]}" --model="$MODEL" --dataset=random --seed="$seed" \
    --num_prompts="$NUM_PROMPTS" --max_concurrency="$CONCURRENCY" --request_rate=inf \
    --input_len="$INPUT_LEN" --output_len="$OUTPUT_LEN" --progress=false \
    --json_out="$out" >/dev/null 2>"$WORK/bench.err" || { cat "$WORK/bench.err" >&2; exit 1; }
  python3 - "$out" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
m = j.get("metrics", j)
print(f'{m["output_throughput"]:.1f} {m["request_throughput"]:.2f} {m["completed"]} {m["failed"]}')
PY
}

run grpc 999 >/dev/null  # warm-up
printf '\n| round | gRPC output tok/s | HTTP output tok/s | gRPC req/s | HTTP req/s | HTTP / gRPC (tok/s) |\n| --- | --- | --- | --- | --- | --- |\n'
ratios=()
for r in $(seq "$ROUNDS"); do
  if (( r % 2 )); then order=(grpc http); else order=(http grpc); fi
  declare -A res=()
  for api in "${order[@]}"; do res[$api]=$(run "$api" $((r * 10 + ${#res[@]}))); done
  read -r gt gr gc gf <<<"${res[grpc]}"
  read -r ht hr hc hf <<<"${res[http]}"
  if [ "$gf" != 0 ] || [ "$hf" != 0 ]; then echo "round $r: failed requests (gRPC $gf, HTTP $hf): left out" >&2; continue; fi
  ratio=$(python3 -c "print(f'{$ht / $gt:.3f}')")
  ratios+=("$ratio")
  echo "| $r | $gt | $ht | $gr | $hr | $ratio |"
  unset res
done
python3 -c "import statistics,sys; r=[float(x) for x in sys.argv[1:]]; print(f'\nmedian HTTP / gRPC output tok/s over {len(r)} rounds: {statistics.median(r):.3f}')" "${ratios[@]}"
