# Shared by the tools/bench scripts (source it): start one `pdserve up`,
# wait for it, stop it by PID. Needs PDSERVE (the binary) set by the caller.
# The caller installs the traps: trap up_stop EXIT; trap 'exit 130' INT TERM

UP_PID=""

# Stops the running `pdserve up` (SIGTERM, then SIGKILL after 20 s); it
# stops its own children.
up_stop() {
  if [[ -n $UP_PID ]] && kill -0 "$UP_PID" 2>/dev/null; then
    kill -TERM "$UP_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$UP_PID" 2>/dev/null || true
  fi
  UP_PID=""
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# up_start LOG_PREFIX FLAGS...: starts `pdserve up FLAGS...` with its output
# in LOG_PREFIX.out/.err, sets UP_PID and waits until it is ready (exits 1
# with its log if it dies or is not ready in 5 minutes).
up_start() {
  local log=$1
  shift
  "$PDSERVE" up --http_port=0 "$@" >"$log.out" 2>"$log.err" &
  UP_PID=$!
  for _ in $(seq 600); do
    grep -q "up: ready" "$log.out" 2>/dev/null && return 0
    kill -0 "$UP_PID" 2>/dev/null || { cat "$log.err" >&2; echo "pdserve up failed ($log)" >&2; exit 1; }
    sleep 0.5
  done
  echo "pdserve up not ready ($log)" >&2
  exit 1
}
