#!/usr/bin/env bash
# Each subcommand takes only its own flags (tools/subcommand.h): `--help`
# lists only those, an unknown or another subcommand's flag is an error that
# names the subcommand (also from a --flagfile), no flag name has two
# meanings, and up checks --kv_transport itself.
#   tests/cli/flags_test.sh PATH/TO/pdserve
set -uo pipefail
PDSERVE=${1:?usage: flags_test.sh PATH/TO/pdserve}
cd "$(dirname "$0")/../.."
FAILS=0
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
ok() { echo "ok: $*"; }

# Runs the command; expects exit status WANT and stderr+stdout containing
# every PATTERN (fixed strings).
expect() {
  local want=$1 what=$2; shift 2
  local -a patterns=()
  while [ "$1" != "--" ]; do patterns+=("$1"); shift; done
  shift
  "$@" >"$WORK/out" 2>&1
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$what: exit $rc, expected $want: $(head -c 400 "$WORK/out")"
    return
  fi
  for p in "${patterns[@]}"; do
    grep -qF -- "$p" "$WORK/out" || { fail "$what: output lacks '$p': $(head -c 400 "$WORK/out")"; return; }
  done
  ok "$what"
}

expect 0 "every registered flag exists and every flag is some subcommand's" \
  "0 problems" -- "$PDSERVE" help --check_flags

# --help of every subcommand: its usage and flags, exit 0.
SUBS=$("$PDSERVE" help | awk '/^subcommands:/{s=1; next} s && /^  [a-z]/{print $1}')
[ "$(echo "$SUBS" | wc -w)" -ge 10 ] || fail "pdserve help lists too few subcommands: $SUBS"
for sub in $SUBS; do
  expect 0 "pdserve $sub --help" "pdserve $sub:" "usage:" -- "$PDSERVE" "$sub" --help
done

# Every flag a usage line shows is one the subcommand takes (listed in its
# --help).
for sub in $SUBS; do
  "$PDSERVE" "$sub" --help >"$WORK/help" 2>&1
  missing=""
  for f in $(sed '/^flags:/,$d' "$WORK/help" | grep -o -- '--[a-z][a-z0-9_]*' | sort -u); do
    grep -q -- "^  $f " "$WORK/help" || missing="$missing $f"
  done
  if [ -n "$missing" ]; then
    fail "pdserve $sub: its usage shows$missing, which it does not take"
  fi
done
ok "every flag in a usage line is the subcommand's own"

# bench-engine's help lists its flags and none of the client's.
"$PDSERVE" bench-engine --help >"$WORK/help" 2>&1
for f in --prompt_len --gen_len --batch --dtype --threads; do
  grep -q -- "^  $f " "$WORK/help" || fail "bench-engine --help lacks $f"
done
for f in --stop --target --tokenizer --temperature --http_port; do
  ! grep -q -- "^  $f " "$WORK/help" || fail "bench-engine --help lists $f, which it does not take"
done
ok "bench-engine --help lists exactly its own flags (checked 5 in, 5 out)"

# A flag of another subcommand: refused, naming this one and the owners.
expect 2 "bench-engine --target (a client's flag)" \
  "pdserve bench-engine: --target is not a flag of \`pdserve bench-engine\`" "pdserve generate" \
  -- "$PDSERVE" bench-engine --target=127.0.0.1:1
expect 2 "router --dtype (a worker's flag)" "pdserve router: --dtype" "pdserve prefill" \
  -- "$PDSERVE" router --dtype=bf16
expect 2 "an unknown flag" "pdserve up: unknown flag --no_such_flag" "pdserve up --help" \
  -- "$PDSERVE" up --no_such_flag=1
# ... also when it comes from a --flagfile (how the Kubernetes manifests pass flags).
printf -- '--port=0\n--dtype=bf16\n' >"$WORK/router.flags"
expect 2 "router --flagfile holding --dtype" "pdserve router: --dtype" \
  -- "$PDSERVE" router "--flagfile=$WORK/router.flags"

# One meaning per name: tokenize decodes with --decode_ids; --decode is up's
# worker count.
expect 0 "tokenize --decode_ids" "<s></s>" \
  -- "$PDSERVE" tokenize --tokenizer=models/stories260K --decode_ids=1,2
expect 2 "tokenize --decode (up's flag)" "pdserve tokenize: --decode" "pdserve up" \
  -- "$PDSERVE" tokenize --tokenizer=models/stories260K --decode=1,2
"$PDSERVE" up --help >"$WORK/help" 2>&1
grep -q -- "^  --decode (default 1)" "$WORK/help" && grep -q -- "^  --prefill (default 1)" "$WORK/help" ||
  fail "up --help does not list --prefill/--decode as worker counts"

# Abseil's other spellings still work: "--flag value", "--noflag", one dash.
expect 0 "complete --max_tokens 2 -prompt_ids 1,2 --noprefix_caching" '"output_ids"' \
  -- "$PDSERVE" complete --max_tokens 2 -prompt_ids 1,2 --noprefix_caching --json

# up checks --kv_transport before starting anything.
expect 1 "up --kv_transport=bogus" "kv_transport" \
  -- timeout 20 "$PDSERVE" up --kv_transport=bogus --port=0 --http_port=0
grep -q "logs in" "$WORK/out" && fail "up --kv_transport=bogus started children before refusing"

# bench-kv-transfer without its ucx_perftest reference names it as not run
# (not a ratio of 0), in text and --json.
expect 0 "bench-kv-transfer without ucx_perftest: reference not run" \
  "ucx_perftest tag_bw not run" \
  -- "$PDSERVE" bench-kv-transfer --kv_bench_tokens=64 --kv_bench_repeats=1 \
  --kv_bench_paths=memcpy,ucx
"$PDSERVE" bench-kv-transfer --kv_bench_tokens=64 --kv_bench_repeats=1 \
  --kv_bench_paths=memcpy,ucx --json >"$WORK/bench.json" 2>/dev/null
if grep -q '"median_gbps"' "$WORK/bench.json" && ! grep -q ratio_to_reference "$WORK/bench.json"; then
  ok "bench-kv-transfer --json leaves out the ratio to a reference that did not run"
else
  fail "bench-kv-transfer --json: $(head -c 400 "$WORK/bench.json")"
fi
# ... and says where a push's time went on P (seal, post, commit), per
# round and as medians, for every push path and no other.
if grep -q '"push_phases_ms"' "$WORK/bench.json" &&
  [ "$(grep -c '"push_phases_ms"' "$WORK/bench.json")" -eq 1 ] &&
  grep -q '"seal"' "$WORK/bench.json" && grep -q '"commit"' "$WORK/bench.json"; then
  ok "bench-kv-transfer --json has the ucx push's phases"
else
  fail "bench-kv-transfer --json lacks push_phases_ms: $(head -c 400 "$WORK/bench.json")"
fi
expect 0 "bench-kv-transfer prints the push's phases" "ucx push on P, ms" \
  -- "$PDSERVE" bench-kv-transfer --kv_bench_tokens=64 --kv_bench_repeats=2 \
  --kv_bench_paths=memcpy,ucx
# ... and refuses what it cannot measure instead of measuring less.
expect 1 "bench-kv-transfer refuses an unknown path" \
  "unknown path 'bogus' (known: memcpy," \
  -- "$PDSERVE" bench-kv-transfer --kv_bench_paths=memcpy,bogus
expect 1 "bench-kv-transfer refuses 0 rounds" \
  "--kv_bench_repeats must be positive" \
  -- "$PDSERVE" bench-kv-transfer --kv_bench_repeats=0

# Workers that cannot start say why and exit 1 (the prefill worker once
# aborted on any engine error: it joined a thread it had not started).
for role in prefill decode; do
  expect 1 "$role with a model that is not there" \
    "pdserve $role: NOT_FOUND: model '/nonexistent' is not a directory" \
    "models/stories260K" "synthetic:NAME" \
    -- timeout 30 "$PDSERVE" "$role" --model=/nonexistent --port=0
  expect 1 "$role with a directory that is not a model" \
    "model directory 'tests/cli' has no config.json" \
    -- timeout 30 "$PDSERVE" "$role" --model=tests/cli --port=0
  expect 1 "$role with a KV budget above the machine's memory" \
    "--kv_cache_memory: memory size 900TiB exceeds" "MemAvailable" \
    -- timeout 30 "$PDSERVE" "$role" --kv_cache_memory=900TiB --port=0
done
# complete names the flag whose path is wrong, and what it wants there.
expect 1 "complete with a model that is not there (text prompt)" \
  "cannot load the tokenizer of --model=/nonexistent" \
  "give a tokenizer.json or the model directory holding one" \
  -- timeout 30 "$PDSERVE" complete --model=/nonexistent hi
expect 1 "complete with a model that is not there (token ids)" \
  "model '/nonexistent' is not a directory" \
  -- timeout 30 "$PDSERVE" complete --model=/nonexistent --prompt_ids=1,2
expect 2 "complete with a TEXT prompt for a synthetic model (it crashed)" \
  "--model=synthetic:tiny has no tokenizer" "--prompt_ids" \
  -- timeout 30 "$PDSERVE" complete --model=synthetic:tiny hi
expect 1 "tokenize with a directory holding no tokenizer.json" \
  "'tests/cli' has no tokenizer.json" \
  -- timeout 30 "$PDSERVE" tokenize --tokenizer=tests/cli hi
expect 1 "a negative --threads is refused" "threads must be 0" \
  -- timeout 30 "$PDSERVE" prefill --threads=-2 --port=0

# bench checks what needs no server before it connects: a bad flag fails at
# once (no router runs here; connecting would wait 15 s).
for args in "--num_prompts=-1|--num_prompts must be positive" \
  "--dataset=nope|unknown dataset 'nope'" \
  "--burstiness=0|--burstiness must be positive" \
  "--request_rate=fast|bad request rate 'fast'" \
  "--max_concurrency=-1|--max_concurrency must be 0" \
  "--top_p=2|--top_p must be in (0, 1]" \
  "--temperature=-1|--temperature must be >= 0" \
  "--json_out=/nonexistent/x.json|cannot write into /nonexistent"; do
  expect 1 "bench ${args%%|*} is refused before connecting" "${args#*|}" \
    -- timeout 5 "$PDSERVE" bench --target=127.0.0.1:1 "${args%%|*}"
done

# Ports outside [-1, 65535] are refused (gRPC wrapped --port=99999 to
# 34463), by up before it starts anything, and by each role.
expect 1 "up --port=99999 is refused" "--port=99999 is not a port" \
  -- timeout 20 "$PDSERVE" up --port=99999
expect 1 "up --http_port=-5 is refused" "--http_port=-5 is not a port" \
  -- timeout 20 "$PDSERVE" up --http_port=-5
expect 1 "up --mode=weird is refused before starting children" \
  "unknown --mode 'weird'" -- timeout 20 "$PDSERVE" up --mode=weird
grep -q "logs in" "$WORK/out" &&
  fail "up --mode=weird started children before refusing"
expect 1 "prefill --port=70000 is refused" "--port=70000 is not a port" \
  -- timeout 20 "$PDSERVE" prefill --port=70000
expect 1 "decode --metrics_port=-7 is refused" \
  "--metrics_port=-7 is not a port" \
  -- timeout 20 "$PDSERVE" decode --metrics_port=-7

# Worker settings that could only hang or misbehave are refused at start.
expect 1 "decode --max_num_seqs=0 is refused" \
  "max_num_seqs must be at least 1" \
  -- timeout 20 "$PDSERVE" decode --port=0 --max_num_seqs=0
expect 2 "complete --max_num_seqs=0 is refused (it hung)" \
  "max_num_seqs must be at least 1" \
  -- timeout 20 "$PDSERVE" complete --model=synthetic:tiny --max_num_seqs=0 \
  --prompt_ids=1,2
expect 1 "decode --kv_lease_seconds=0 is refused" \
  "kv_lease_seconds must be positive" \
  -- timeout 20 "$PDSERVE" decode --port=0 --kv_lease_seconds=0
expect 1 "prefill --max_prefill_queue=-1 is refused" \
  "must be 0 (no limit) or more" \
  -- timeout 20 "$PDSERVE" prefill --port=0 --max_prefill_queue=-1
expect 1 "generate --concurrency=0 is refused" \
  "--concurrency must be 1 to 1024" \
  -- timeout 20 "$PDSERVE" generate --target=127.0.0.1:1 --concurrency=0 hi
expect 1 "generate with no router at --target says what to do" \
  "no router answers at --target=127.0.0.1:1" "pdserve up" \
  -- timeout 30 "$PDSERVE" generate --target=127.0.0.1:1 hi
expect 1 "generate refuses an empty --target" "--target is empty" \
  -- timeout 20 "$PDSERVE" generate --target= hi
expect 1 "bench refuses an empty --target" "--target is empty" \
  -- timeout 20 "$PDSERVE" bench --target=
expect 1 "router --max_attempts=0 is refused" "--max_attempts must be >= 1" \
  -- timeout 20 "$PDSERVE" router --mode=colocated \
  --decode_workers=127.0.0.1:1 --port=0 --http_port=0 --max_attempts=0
expect 1 "router refuses a worker target that is not host:port" \
  "--decode_workers: 'bad' is not HOST:PORT" \
  -- timeout 20 "$PDSERVE" router --mode=colocated --decode_workers=bad \
  --port=0 --http_port=0
echo "not a certificate" >"$WORK/not.pem"
expect 1 "a TLS file that is not PEM is named (it read as 'cannot listen')" \
  "$WORK/not.pem is not a PEM certificate" \
  -- timeout 20 "$PDSERVE" router --mode=colocated \
  --decode_workers=127.0.0.1:1 --port=0 --http_port=0 \
  --tls_cert="$WORK/not.pem" --tls_key="$WORK/not.pem"
expect 1 "complete --threads=100000 is refused (thread creation aborted)" \
  "threads must be 0 (all cores) to 1024" \
  -- timeout 20 "$PDSERVE" complete --model=synthetic:tiny --threads=100000 \
  --prompt_ids=1,2
# up: the workers' KV pools together must fit (each worker alone checks
# only its own, and they start at once).
expect 1 "up refuses KV pools that do not fit together" \
  "for each of 3 workers is" "give each less" \
  -- timeout 20 "$PDSERVE" up --decode=2 --prefill=1 --kv_cache_memory=0.4
grep -q "logs in" "$WORK/out" &&
  fail "up started children before refusing the KV pools"

if [ "$FAILS" -ne 0 ]; then echo "$FAILS check(s) failed"; exit 1; fi
echo "PASS"
