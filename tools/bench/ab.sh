#!/usr/bin/env bash
# A/B benchmark of two builds in one run: runs OLD and NEW alternately
# (ROUNDS rounds, default 5; the order within a round alternates too), each
# with the same BENCH_ARGS plus `--json`, and prints every numeric figure's
# median per binary and the median (min, max) of the per-round ratios
# NEW / OLD. Rates measured minutes apart on a shared machine are not
# comparable; ratios within one round are.
#
#   tools/bench/ab.sh OLD_BINARY NEW_BINARY -- bench-engine --model=... [...]
#
# Environment:
#   ROUNDS=5          rounds (each runs both binaries once)
#   A_ARGS / B_ARGS   extra arguments for OLD / NEW only (to compare two
#                     configurations of one binary: ab.sh X X -- ... with
#                     B_ARGS=--quantization=int8)
#   FIGURES=REGEX     figures to print (default: tokens_per_s, gflops,
#                     fraction_of_gemm, median_step_ms, ratio_to_first)
#   NICE=-15          niceness of the benchmark processes (needs root for < 0)
#   KEEP=DIR          keep every run's JSON in DIR
set -euo pipefail

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
[[ $# -ge 3 ]] || usage
OLD=$1
NEW=$2
shift 2
[[ ${1:-} == "--" ]] || usage
shift
ROUNDS=${ROUNDS:-5}
NICE=${NICE:--15}
FIGURES=${FIGURES:-'tokens_per_s|gflops$|fraction_of_gemm|median_step_ms|ratio_to_first'}
read -r -a A_EXTRA <<<"${A_ARGS:-}"
read -r -a B_EXTRA <<<"${B_ARGS:-}"
for b in "$OLD" "$NEW"; do
  [[ -x $b ]] || { echo "ab.sh: $b is not an executable" >&2; exit 2; }
done
OUT=${KEEP:-$(mktemp -d)}
mkdir -p "$OUT"
[[ -n ${KEEP:-} ]] || trap 'rm -rf "$OUT"' EXIT

run() {  # run LABEL BINARY ROUND EXTRA...
  local label=$1 bin=$2 round=$3
  shift 3
  local nice_cmd=(nice -n "$NICE")
  nice -n "$NICE" true 2>/dev/null || nice_cmd=()
  if ! "${nice_cmd[@]}" "$bin" "$@" --json >"$OUT/$label.$round.json" \
      2>"$OUT/$label.$round.err"; then
    echo "ab.sh: $label run $round failed:" >&2
    tail -5 "$OUT/$label.$round.err" >&2
    exit 1
  fi
}

echo "ab.sh: $ROUNDS rounds; OLD=$OLD ${A_ARGS:-}; NEW=$NEW ${B_ARGS:-}"
echo "ab.sh: args: $*"
echo "ab.sh: load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= ROUNDS; ++r)); do
  if ((r % 2)); then
    run old "$OLD" "$r" "$@" "${A_EXTRA[@]}"
    run new "$NEW" "$r" "$@" "${B_EXTRA[@]}"
  else
    run new "$NEW" "$r" "$@" "${B_EXTRA[@]}"
    run old "$OLD" "$r" "$@" "${A_EXTRA[@]}"
  fi
  echo "ab.sh: round $r/$ROUNDS done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
done
echo "ab.sh: load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$OUT" "$ROUNDS" "$FIGURES" <<'PY'
import json, re, statistics, sys
out, rounds, pattern = sys.argv[1], int(sys.argv[2]), re.compile(sys.argv[3])

def flatten(prefix, v, acc):
    if isinstance(v, dict):
        for k, x in v.items():
            flatten(f"{prefix}.{k}" if prefix else k, x, acc)
    elif isinstance(v, list):
        if all(isinstance(x, dict) for x in v):
            for i, x in enumerate(v):
                tag = (f"batch={x['batch']}" if "batch" in x else
                       f"context={x['context']}" if "context" in x else str(i))
                flatten(f"{prefix}[{tag}]", x, acc)
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        acc[prefix] = float(v)

def load(label, r):
    lines = open(f"{out}/{label}.{r}.json").read().strip().splitlines()
    try:  # one line (bench-engine), or an indented object (bench-kv-transfer)
        value = json.loads(lines[-1])
    except json.JSONDecodeError:
        first = next(i for i, l in enumerate(lines) if l.startswith("{"))
        value = json.loads("\n".join(lines[first:]))
    acc = {}
    flatten("", value, acc)
    return acc

old = [load("old", r) for r in range(1, rounds + 1)]
new = [load("new", r) for r in range(1, rounds + 1)]
keys = [k for k in old[0] if pattern.search(k) and k in new[0]]
w = max([len(k) for k in keys] + [6])
print(f"{'figure':<{w}}  {'OLD median':>12}  {'NEW median':>12}  "
      f"{'NEW/OLD (median of rounds)':>26}  {'min..max':>13}")
for k in keys:
    a = [o[k] for o in old]
    b = [n[k] for n in new]
    ratios = [y / x for x, y in zip(a, b) if x]
    med = statistics.median(ratios) if ratios else float("nan")
    print(f"{k:<{w}}  {statistics.median(a):12.4g}  {statistics.median(b):12.4g}"
          f"  {med:26.3f}  " + (f"{min(ratios):6.3f}..{max(ratios):<6.3f}"
                                   if ratios else "(OLD is 0)"))
PY
