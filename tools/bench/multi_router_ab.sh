#!/usr/bin/env bash
# Several routers in front of the same workers, under one burst, for two
# builds: starts ROUTERS routers (each told the same prefill and decode
# workers), runs one `pdserve bench` per router at the same time, stops
# everything by PID, alternating binary A and binary B (ROUNDS rounds, the
# order within a round alternating too). Prints per round and binary what
# was served and what failed (by status), and the medians of the served
# count and of the goodput (requests served / the longest client's time).
#
#   tools/bench/multi_router_ab.sh A_BINARY B_BINARY -- BENCH_ARGS
#   e.g. tools/bench/multi_router_ab.sh /tmp/old/pdserve build/pdserve -- \
#          --num_prompts=1500 --input_len=64 --output_len=16
#   (BENCH_ARGS are each client's: 2 routers x 1500 prompts = a 3000 burst)
#
# Environment:
#   ROUTERS=2         routers (and bench clients)
#   ROUNDS=3          rounds (each runs both binaries once)
#   PREFILL=1         prefill workers
#   DECODE=1          decode workers
#   WORKER_ARGS=...   flags for every worker (model, dtype, threads)
#   KEEP=DIR          keep every run's logs and JSON in DIR
set -euo pipefail

usage() {
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
[[ $# -ge 3 && $3 == "--" ]] || usage
A_BIN=$1
B_BIN=$2
shift 3
for b in "$A_BIN" "$B_BIN"; do
  [[ -x $b ]] || { echo "multi_router_ab.sh: $b is not an executable" >&2; exit 2; }
done
ROUTERS=${ROUTERS:-2}
ROUNDS=${ROUNDS:-3}
PREFILL=${PREFILL:-1}
DECODE=${DECODE:-1}
read -r -a WORKER_ARGS <<<"${WORKER_ARGS:-}"
OUT=${KEEP:-$(mktemp -d)}
mkdir -p "$OUT"

PIDS=()
stop_all() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap 'stop_all; [[ -n ${KEEP:-} ]] || rm -rf "$OUT"' EXIT
trap 'exit 130' INT TERM

# wait_port FILE: the port a service wrote to its --port_file.
wait_port() {
  for _ in $(seq 300); do
    [[ -s $1 ]] && { grep -o '[0-9]\+' "$1" | head -1; return 0; }
    sleep 0.1
  done
  echo "multi_router_ab.sh: no port in $1; logs in $OUT" >&2
  exit 1
}

run() {  # run LABEL ROUND
  local label=$1 round=$2 bin=$A_BIN i dir
  shift 2
  [[ $label == B ]] && bin=$B_BIN
  dir="$OUT/$label.$round"
  mkdir -p "$dir"
  local pw=() dw=()
  for ((i = 0; i < PREFILL; ++i)); do
    "$bin" prefill --host=127.0.0.1 --port=0 --port_file="$dir/p$i.port" \
      "${WORKER_ARGS[@]}" >"$dir/p$i.log" 2>&1 &
    PIDS+=($!)
  done
  for ((i = 0; i < DECODE; ++i)); do
    "$bin" decode --host=127.0.0.1 --port=0 --port_file="$dir/d$i.port" \
      "${WORKER_ARGS[@]}" >"$dir/d$i.log" 2>&1 &
    PIDS+=($!)
  done
  for ((i = 0; i < PREFILL; ++i)); do pw+=("127.0.0.1:$(wait_port "$dir/p$i.port")"); done
  for ((i = 0; i < DECODE; ++i)); do dw+=("127.0.0.1:$(wait_port "$dir/d$i.port")"); done
  local ports=()
  for ((i = 0; i < ROUTERS; ++i)); do
    "$bin" router --host=127.0.0.1 --port=0 --http_port=0 \
      --port_file="$dir/r$i.port" \
      --prefill_workers="$(IFS=,; echo "${pw[*]}")" \
      --decode_workers="$(IFS=,; echo "${dw[*]}")" >"$dir/r$i.log" 2>&1 &
    PIDS+=($!)
  done
  for ((i = 0; i < ROUTERS; ++i)); do ports+=("$(wait_port "$dir/r$i.port")"); done
  sleep 1  # the routers' first status polls
  local clients=()
  for ((i = 0; i < ROUTERS; ++i)); do
    "$bin" bench --target="127.0.0.1:${ports[$i]}" --json_out="$dir/b$i.json" \
      "$@" >"$dir/b$i.out" 2>&1 &
    clients+=($!)
  done
  for p in "${clients[@]}"; do wait "$p" || true; done
  stop_all
}

echo "multi_router_ab.sh: $ROUNDS rounds, $ROUTERS routers, $PREFILL prefill + $DECODE decode workers"
echo "multi_router_ab.sh: A: $A_BIN; B: $B_BIN; bench args: $*"
for ((r = 1; r <= ROUNDS; ++r)); do
  if ((r % 2 == 1)); then run A "$r" "$@"; run B "$r" "$@"; else run B "$r" "$@"; run A "$r" "$@"; fi
  echo "multi_router_ab.sh: round $r/$ROUNDS done"
done

python3 - "$OUT" "$ROUNDS" "$ROUTERS" <<'EOF'
import collections, glob, json, statistics, sys
out, rounds, routers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
res = {}
for label in "AB":
    for r in range(1, rounds + 1):
        d = f"{out}/{label}.{r}"
        served = failed = 0
        longest = 0.0
        codes = collections.Counter()
        for i in range(routers):
            try:
                m = json.load(open(f"{d}/b{i}.json"))["metrics"]
            except (OSError, KeyError, ValueError):
                sys.exit(f"multi_router_ab.sh: no results from client {i} in {d}")
            served += m["completed"]
            failed += m["failed"]
            longest = max(longest, m["duration_s"])
        # The clients' "Errors" sections: failures by status code.
        for log in glob.glob(f"{d}/b*.out"):
            section = False
            for line in open(log, errors="replace"):
                if "Errors" in line:
                    section = True
                elif section and line.startswith("="):
                    section = False
                elif section and ":" in line:
                    code, n = line.rsplit(":", 1)
                    codes[code.strip()] += int(n)
        res[label, r] = (served, failed, served / longest if longest else 0.0, codes)
        print(f"{label} round {r}: served {served}, failed {failed} "
              f"{dict(codes) if codes else ''}, goodput {res[label, r][2]:.1f} req/s")
for label in "AB":
    s = [res[label, r][0] for r in range(1, rounds + 1)]
    g = [res[label, r][2] for r in range(1, rounds + 1)]
    print(f"{label}: served median {statistics.median(s)}, goodput median {statistics.median(g):.1f} req/s")
ratios = [res["B", r][2] / res["A", r][2] for r in range(1, rounds + 1) if res["A", r][2]]
if ratios:
    print(f"goodput B/A: median {statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f})")
EOF
