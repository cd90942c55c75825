#!/usr/bin/env bash
# The service roles under AddressSanitizer + UBSan + LeakSanitizer: builds
# pdserve with -DPDSERVE_ASAN=ON (in $BUILD, default build-asan; the first
# build takes 30-40 minutes on 2 cores), starts a prefill worker, a decode
# worker and a router on loopback, sends gRPC and HTTP traffic (streamed
# n > 1 choices, scoring, a refusal, requests cancelled by their client while
# they run and while they wait for admission, a half-closed GET), stops the
# three with SIGTERM (the router with a stream still running past its drain
# timeout)
# and fails when any of them reported a sanitizer error or leaked anything
# but the metrics server each keeps on purpose at exit
# (ReleaseMetricsServerAtExit). Not part of CI (the build is too long);
# run it after changing who owns what in the router or the workers.
#   scripts/asan_services_check.sh            (exit 0: clean)
#   KEEP=DIR scripts/asan_services_check.sh   (the roles' logs stay in DIR)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-asan}
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPDSERVE_ASAN=ON -DPDSERVE_CUDA=OFF >/dev/null || exit 1
fi
echo "asan check: building $BUILD/pdserve" >&2
cmake --build "$BUILD" --target pdserve -j "$(nproc)" >/dev/null || exit 1
PDSERVE="$BUILD/pdserve"
WORK=${KEEP:-$(mktemp -d /tmp/pdserve-asan-XXXXXX)}
mkdir -p "$WORK"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT
printf 'leak:pdserve::metrics::MetricsServer::Start\n' >"$WORK/lsan.supp"
export ASAN_OPTIONS=detect_leaks=1
export LSAN_OPTIONS="suppressions=$WORK/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# Starts a role in the background and waits for the port it writes
# (PORT holds it after).
start() {
  local name=$1; shift
  "$PDSERVE" "$@" --port=0 --port_file="$WORK/$name.port" \
    --metrics_port=-1 >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 600); do
    if [ -s "$WORK/$name.port" ]; then
      PORT=$(head -1 "$WORK/$name.port")
      return 0
    fi
    kill -0 "${PIDS[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "asan check: $name did not start:" >&2
  tail -20 "$WORK/$name.log" >&2
  exit 1
}
start prefill prefill; P=$PORT
start decode decode --testonly_stream_delay_ms=20; D=$PORT
start router router --http_port=-1 --max_in_flight=1 --admission_queue=4 \
  --drain_timeout_seconds=1 \
  --prefill_workers=127.0.0.1:$P --decode_workers=127.0.0.1:$D
R=$PORT
HTTP=$(sed -n 's/^http=//p' "$WORK/router.port")
echo "asan check: prefill :$P, decode :$D, router :$R (HTTP :$HTTP)" >&2

FAILED=0
run() {
  "$@" >/dev/null 2>&1 || { echo "asan check: failed: $*" >&2; FAILED=1; }
}
run "$PDSERVE" generate --target=127.0.0.1:$R --max_tokens=20 "Once upon a time"
run "$PDSERVE" generate --target=127.0.0.1:$R --max_tokens=0 \
  --prompt_logprobs=2 "Once upon a time"
python3 - "$HTTP" <<'EOF' || FAILED=1
import json, socket, sys, time, urllib.request
port = int(sys.argv[1])
def complete(body, want=200):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
        headers={"content-type": "application/json"})
    try:
        status = urllib.request.urlopen(req, timeout=60).status
    except urllib.error.HTTPError as e:
        status = e.code
    assert status == want, (body, status)
def raw(body):
    s = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
              b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
    return s
complete({"prompt": "Tom", "max_tokens": 5, "n": 3, "stream": True,
          "echo": True, "logprobs": 2})
complete({"prompt": "Tom", "max_tokens": 0, "n": 2, "echo": True, "logprobs": 2})
complete({"prompt": "Tom", "max_tokens": -1}, want=400)
for _ in range(3):
    # One request runs (the only slot), one waits for admission; both
    # clients go away.
    running = raw({"prompt": "Tom", "max_tokens": 200, "ignore_eos": True,
                   "stream": True})
    running.recv(1)
    waiting = raw({"prompt": "Tom", "max_tokens": 2})
    time.sleep(0.3)
    waiting.close()
    running.close()
    time.sleep(0.5)
# A GET from a client that half-closes after it (nc -N) is answered.
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
s.shutdown(socket.SHUT_WR)
assert b" 200 " in s.recv(4096)
EOF
# A stream still running when the router's 1 s drain timeout passes: it
# ends with the error event (GenerationCore::StopRunning).
python3 - "$HTTP" "$WORK/drained.txt" <<'EOF' &
import json, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
data = json.dumps({"prompt": "Tom", "max_tokens": 400, "ignore_eos": True,
                   "stream": True}).encode()
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
          b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
got = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    got += chunk
open(sys.argv[2], "wb").write(got)
EOF
DRAINED_CLIENT=$!
sleep 1

# SIGTERM: the router first (it drains), then the workers.
for i in 2 0 1; do
  kill -TERM "${PIDS[$i]}" 2>/dev/null
  wait "${PIDS[$i]}" 2>/dev/null
done
PIDS=()
wait "$DRAINED_CLIENT"
grep -q "drain timeout" "$WORK/drained.txt" ||
  { echo "asan check: the stream past the drain timeout got no error event" >&2; FAILED=1; }
for name in prefill decode router; do
  if grep -qE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" \
      "$WORK/$name.log"; then
    echo "asan check: $name reported:" >&2
    grep -E -A25 "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" \
      "$WORK/$name.log" | head -60 >&2
    FAILED=1
  else
    echo "asan check: $name: clean" >&2
  fi
done
[ -n "${KEEP:-}" ] && echo "asan check: logs in $WORK" >&2
if [ "$FAILED" -ne 0 ]; then echo "asan check: FAIL" >&2; exit 1; fi
echo "asan check: PASS" >&2
