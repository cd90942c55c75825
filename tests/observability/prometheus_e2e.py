#!/usr/bin/env python3
"""End-to-end check of deploy/prometheus and deploy/grafana with a real Prometheus.

Starts a local pdserve cluster (`pdserve up`, unless --targets names a running
one), starts the Debian `prometheus` binary on a free loopback port with a
temporary data directory and the repository's deploy/prometheus config (copied,
with 1 s scrape/evaluation intervals and a file_sd targets file written here),
waits until every target is up through /api/v1/targets, sends requests with
`pdserve generate`, lints every /metrics endpoint with `promtool check
metrics`, and checks through /api/v1/query that every query of
deploy/grafana/pdserve.json returns data. Everything it starts is stopped by
PID (process group of each child) on exit, also on failure or SIGTERM.

Exit status: 0 pass, 1 a check failed, 2 a prerequisite is missing (e.g. this
build has no `pdserve up`): never a silent skip.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

COMPONENTS = ("router", "prefill", "decode")
children = []  # Popen objects started by this script


def log(msg):
    print(f"[prometheus_e2e] {msg}", flush=True)


class Failure(Exception):
    pass


class Missing(Exception):
    pass


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, **kwargs):
    """Starts a child in its own process group (pgid == pid)."""
    log("start: " + " ".join(cmd))
    p = subprocess.Popen(cmd, start_new_session=True, **kwargs)
    children.append(p)
    return p


def stop_all():
    for p in reversed(children):
        if p.poll() is not None:
            continue
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            log(f"pid {p.pid} ignored SIGTERM; SIGKILL")
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        log(f"stopped pid {p.pid} (exit {p.returncode})")


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


def api(prom, path, **params):
    url = f"http://{prom}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    status, body = http_get(url, timeout=10)
    data = json.loads(body)
    if data.get("status") != "success":
        raise Failure(f"{path}: {body[:500]}")
    return data["data"]


def wait_until(what, fn, timeout, interval=0.5):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            ok, last = fn()
            if ok:
                return last
        except (OSError, urllib.error.URLError, ValueError) as e:
            last = e
        time.sleep(interval)
    raise Failure(f"timed out after {timeout}s waiting for {what}; last: {last}")


HOSTPORT = r"((?:\d{1,3}(?:\.\d{1,3}){3}|localhost|\[[0-9a-fA-F:]+\]):(\d+))"


def parse_up_line(line, targets, router):
    """Reads one line of `pdserve up` output.

    Understood forms (one process per line; case-insensitive), e.g.
      router   127.0.0.1:50051  metrics http://127.0.0.1:9090/metrics
      prefill[0] grpc=127.0.0.1:50052 metrics=127.0.0.1:9091
      decode[1] 127.0.0.1:50054 metrics_port=9093        (host: 127.0.0.1)
    The first host:port (or bare port) after the word "metrics" is that
    process's metrics endpoint; the first host:port before it on a router line
    is the router's gRPC address.
    """
    low = line.lower()
    comp = next((c for c in COMPONENTS if re.search(rf"\b{c}", low)), None)
    if comp is None:
        return router
    m = re.search(r"metrics", line, re.I)
    before = line if m is None else line[:m.start()]
    if m:
        rest = line[m.end():]
        hp = re.search(HOSTPORT, rest)
        if hp:
            targets.append((comp, hp.group(1)))
        else:
            port = re.search(r"[\s=:](\d{2,5})\b", rest)
            if port:
                targets.append((comp, f"127.0.0.1:{port.group(1)}"))
    if comp == "router" and router is None:
        hp = re.search(HOSTPORT, before)
        if hp:
            return hp.group(1)
    return router


def start_cluster(args):
    help_text = subprocess.run([args.pdserve, "help"], capture_output=True,
                               text=True).stdout
    if not re.search(r"^\s+up\s", help_text, re.M):
        raise Missing(
            "this pdserve build has no `up` subcommand (tools/service_cmds/up.cc);"
            " the end-to-end Prometheus check needs a local cluster. Pass"
            " --targets component=host:port,... to check a running one.")
    # --port=0: the router binds a free port itself and `up` prints it (a
    # port picked here could be taken by a parallel test before the router
    # binds it, which once failed a CI run).
    cmd = [args.pdserve, "up", "--port=0", "--http_port=-1"] + args.up_flag
    p = start(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
              cwd=args.repo)
    targets, router, lines = [], None, []
    ready = threading.Event()

    def reader():
        nonlocal router
        for line in p.stdout:
            lines.append(line.rstrip())
            if args.verbose:
                log("up| " + line.rstrip())
            router = parse_up_line(line, targets, router)
            if router and {c for c, _ in targets} >= set(COMPONENTS):
                ready.set()
            if re.search(r"\bready\b", line, re.I):  # "pdserve up: ready"
                ready.set()
        ready.set()

    threading.Thread(target=reader, daemon=True).start()
    ready.wait(args.up_timeout)
    time.sleep(1.0)  # let the remaining lines (other workers) arrive
    if p.poll() is not None:
        raise Failure(f"`pdserve up` exited ({p.returncode}). Output:\n" +
                      "\n".join(lines[-40:]))
    comps = {c for c, _ in targets}
    if router is None or comps < set(COMPONENTS):
        raise Failure("could not read router address and metrics endpoints"
                      f" of {COMPONENTS} from `pdserve up`; got router={router}"
                      f" targets={targets}. Output:\n" + "\n".join(lines[-40:]))
    return targets, router


def write_prometheus_dir(repo, tmp, targets):
    src = os.path.join(repo, "deploy", "prometheus")
    shutil.copytree(os.path.join(src, "rules"), os.path.join(tmp, "rules"))
    with open(os.path.join(src, "prometheus.yml")) as f:
        config = f.read()
    # Same config, faster clock, so the test needs seconds, not minutes.
    config = re.sub(r"(scrape_interval|evaluation_interval): \S+", r"\1: 1s",
                    config)
    with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
        f.write(config)
    os.makedirs(os.path.join(tmp, "targets"))
    groups = [{"targets": [addr], "labels": {"component": comp}}
              for comp, addr in targets]
    with open(os.path.join(tmp, "targets", "pdserve.json"), "w") as f:
        json.dump(groups, f, indent=1)
    return os.path.join(tmp, "prometheus.yml")


def dashboard_exprs(repo):
    with open(os.path.join(repo, "deploy", "grafana", "pdserve.json")) as f:
        dash = json.load(f)
    out = []

    def walk(j, panel):
        if isinstance(j, dict):
            panel = j.get("title", panel) if "targets" in j else panel
            for k, v in j.items():
                if k == "expr" and isinstance(v, str):
                    out.append((panel, v))
                else:
                    walk(v, panel)
        elif isinstance(j, list):
            for v in j:
                walk(v, panel)

    walk(dash, "")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pdserve", default="build/pdserve")
    ap.add_argument("--repo", default=os.getcwd())
    ap.add_argument("--targets", default="",
                    help="component=host:port,... of a running cluster (no"
                    " `pdserve up`); with --router requests are sent too")
    ap.add_argument("--router", default="", help="router gRPC host:port")
    ap.add_argument("--up_flag", action="append", default=[],
                    help="extra flag for `pdserve up` (repeatable)")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--up_timeout", type=float, default=120)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    args.repo = os.path.abspath(args.repo)

    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            raise Missing(f"`{tool}` not found: install the Debian package"
                          " `prometheus` (scripts/install_deps.sh)")
    if args.targets:
        targets = [tuple(t.split("=", 1)) for t in args.targets.split(",")]
        router = args.router or None
    else:
        if not os.access(args.pdserve, os.X_OK):
            raise Missing(f"{args.pdserve} is not an executable pdserve binary")
        targets, router = start_cluster(args)
    log(f"targets: {targets}; router: {router}")

    tmp = tempfile.mkdtemp(prefix="pdserve-prom-")
    try:
        config = write_prometheus_dir(args.repo, tmp, targets)
        subprocess.run(["promtool", "check", "config", config], check=True,
                       stdout=subprocess.DEVNULL)
        plog_path = os.path.join(tmp, "prometheus.log")
        # The port is picked here and bound by Prometheus later: a parallel
        # test may take it in between, so a taken port means another try.
        for attempt in range(1, 4):
            prom = f"127.0.0.1:{free_port()}"
            with open(plog_path, "w") as plog:
                pp = start(["prometheus", f"--config.file={config}",
                            f"--storage.tsdb.path={os.path.join(tmp, 'data')}",
                            f"--web.listen-address={prom}", "--log.level=warn"],
                           stdout=plog, stderr=subprocess.STDOUT, cwd=tmp)

            def ready():
                if pp.poll() is not None:
                    raise Failure("prometheus exited: " +
                                  open(plog_path).read())
                return http_get(f"http://{prom}/-/ready")[0] == 200, "not ready"

            try:
                wait_until("Prometheus ready", ready, 30)
                break
            except Failure:
                taken = "address already in use" in open(plog_path).read()
                if not taken or attempt == 3:
                    raise
                log(f"port {prom} was taken before Prometheus bound it;"
                    " another one")
        log(f"prometheus {pp.pid} ready on {prom}")

        def all_up():
            active = [t for t in api(prom, "/api/v1/targets")["activeTargets"]
                      if t["labels"].get("job") == "pdserve-local"]
            states = {t["scrapeUrl"]: (t["health"], t.get("lastError", ""))
                      for t in active}
            return (len(active) == len(targets) and
                    all(h == "up" for h, _ in states.values())), states

        states = wait_until("every target up", all_up, 60)
        log(f"all {len(states)} targets up: {sorted(states)}")

        # promtool's linter accepts every process's exposition.
        for comp, addr in targets:
            _, body = http_get(f"http://{addr}/metrics")
            lint = subprocess.run(["promtool", "check", "metrics"],
                                  input=body, capture_output=True, text=True)
            if lint.returncode != 0:
                raise Failure(f"promtool check metrics {comp} {addr}:\n"
                              f"{lint.stdout}{lint.stderr}")

        if router:
            for i in range(args.requests):
                r = subprocess.run(
                    [args.pdserve, "generate", f"--target={router}",
                     "--max_tokens=24", f"Once upon a time, story {i}"],
                    capture_output=True, text=True, timeout=60, cwd=args.repo)
                if r.returncode != 0:
                    raise Failure(f"pdserve generate failed ({r.returncode}):"
                                  f" {r.stderr.strip()}")
            log(f"sent {args.requests} requests through {router}")
        time.sleep(3)  # rate() needs samples from a few scrapes (1 s apart)
        if router:
            ok = api(prom, "/api/v1/query",
                     query='sum(pdserve_requests_total{code="OK"})')["result"]
            got = float(ok[0]["value"][1]) if ok else 0
            if got < args.requests:
                raise Failure(f"Prometheus sees {got} OK requests, sent"
                              f" {args.requests}")

        exprs = dashboard_exprs(args.repo)
        empty, nan = [], []
        for panel, expr in exprs:
            q = (expr.replace("$__rate_interval", "5m")
                 .replace("$__interval", "5m").replace("$__range", "5m"))
            result = api(prom, "/api/v1/query", query=q)["result"]
            if not result:
                empty.append(f"  [{panel}] {expr}")
            elif all(r["value"][1] in ("NaN", "+Inf", "-Inf") for r in result):
                nan.append(f"  [{panel}] {expr}")
        log(f"{len(exprs)} dashboard queries: {len(exprs) - len(empty)} return"
            f" data, {len(nan)} of them only NaN (no events of that kind yet)")
        for line in nan:
            log("NaN only:" + line)
        if empty:
            raise Failure("dashboard queries with no data:\n" + "\n".join(empty))
        log("PASS")
        return 0
    finally:
        stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
    try:
        sys.exit(main())
    except Missing as e:
        log(f"FAIL (prerequisite missing): {e}")
        stop_all()
        sys.exit(2)
    except (Failure, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        log(f"FAIL: {e}")
        stop_all()
        sys.exit(1)
    except BaseException:
        stop_all()
        raise
