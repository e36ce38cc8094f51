"""Requests/s and latency of ``tierec serve`` on 127.0.0.1: a small, bounded load generator.

Starts ``tierec serve EXPORT`` on a free local port (or uses ``--url``), then for
each request size (default 1 and 256 rows) sends requests over ``--connections``
keep-alive HTTP connections, closed loop (each connection sends its next request
when the previous answer arrives), after ``--warmup`` requests, until
``--requests`` requests or ``--seconds`` seconds, whichever comes first. Rows
are the held-out lines of a raw Criteo file (default: the sample in
``../shared/data``, read at run time, never copied), cycled. Prints requests/s,
scored rows/s and p50 / p99 / max latency in milliseconds per size.

    python -m benchmarks.serving --export /tmp/prec/export-criteo-head10000-fp32 --json docs/bench/serving.json

Latency while deltas are applied (``--deltas WORK``, instead of ``--export``):
``tierec train`` on ``--data`` (its last ``--rows`` lines held out, the rows
sent) with ``train.delta_every = --delta-every`` writes a full checkpoint and
a chain of deltas of it into ``WORK/run``; the deltas are moved aside
(``WORK/staged``), later full checkpoints dropped, and the full one exported.
Then ``tierec serve EXPORT --follow WORK/run --poll --poll`` runs the load,
and while it is measured a thread renames the deltas back into the run, one
every ``--delta-interval`` seconds, in order. The server's log says when each
delta was applied and how long it took (read and timestamped here as it is
written); a request is "during" when its span overlaps one such application
(from its start to its swap), "other" otherwise, and each group gets its
latency percentiles. Also printed: deltas published, deltas applied (the
server's log) and the step served at the end (``GET /version``). Make
``--seconds`` about the deltas' count times ``--delta-interval``. The issue's
target: 1-row p99 <= 20 ms while a delta is applied.

    python -m benchmarks.serving --deltas /tmp/servedelta --sizes 1 --delta-every 2 --delta-interval 0.5 \
        --seconds 14 --requests 100000 --json docs/bench/serving-deltas.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
import urllib.request
from urllib.parse import urlparse

import numpy as np

from tierec.data.schema import CRITEO_COLUMNS

REPO = Path(__file__).resolve().parents[1]
CRITEO = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "criteo" / "train_head10000.txt"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def start_server(export: Path, follow: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """``tierec serve export`` on a free port; ``follow`` (its extra arguments): the server's stdout is a pipe."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out, err = (subprocess.DEVNULL, subprocess.DEVNULL) if follow is None else (subprocess.PIPE, subprocess.STDOUT)
    proc = subprocess.Popen([sys.executable, "-m", "tierec", "serve", str(export), "--port", str(port), *(follow or [])],
                            env=_env(), stdout=out, stderr=err, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, url
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("the server did not start within 120 s")


def load(url: str, bodies: list[bytes], connections: int, requests: int, seconds: float, warmup: int,
         spans: list[tuple[float, float]] | None = None, on_start=None) -> dict:  # fmt: skip
    """Closed-loop load over ``connections`` keep-alive connections; latencies of the measured requests
    (their (start, end) in ``time.perf_counter`` seconds appended to ``spans``); ``on_start()`` is called
    when the measured requests begin."""
    u = urlparse(url)
    lock = threading.Lock()
    latencies: list[float] = []
    state = {"sent": 0, "errors": 0}
    stop_at = [0.0]

    def worker(k: int) -> None:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        i = k
        while True:
            with lock:
                if state["sent"] >= warmup + requests or (stop_at[0] and time.monotonic() > stop_at[0]):
                    break
                state["sent"] += 1
                measured = state["sent"] > warmup
            body = bodies[i % len(bodies)]
            i += connections
            t0 = time.perf_counter()
            conn.request("POST", "/score", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            t1 = time.perf_counter()
            with lock:
                if r.status != 200:
                    state["errors"] += 1
                if measured:
                    latencies.append(t1 - t0)
                    if spans is not None:
                        spans.append((t0, t1))
        conn.close()

    # warm-up first (one connection), then the measured run with a deadline
    for b in bodies[:warmup]:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("POST", "/score", b, {"Content-Type": "application/json"})
        conn.getresponse().read()
        conn.close()
    state["sent"] = warmup
    if on_start is not None:
        on_start()
    stop_at[0] = time.monotonic() + seconds
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"requests": len(latencies), "errors": state["errors"], "seconds": wall, "requests_per_s": len(latencies) / wall,
            **percentiles(latencies)}  # fmt: skip


def percentiles(latencies: list[float]) -> dict:
    lat = np.array(latencies) * 1000.0
    if not lat.size:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    return {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)), "max_ms": float(lat.max())}


APPLIED = re.compile(r"^step (\d+): applied (\S+) .* in ([0-9.]+) s$")


def prepare_deltas(work: Path, data: Path, rows: int, delta_every: int, sets: list[str]) -> tuple[Path, Path, list[Path]]:
    """Train on ``data`` (its last ``rows`` lines held out) with a delta every ``delta_every`` steps into
    ``work/run``; its first full checkpoint stays (the deltas' base), the deltas of it go to ``work/staged``
    in order, later full checkpoints are dropped, and the base is exported to ``work/export``."""
    from tierec.serving.export import export_checkpoint

    shutil.rmtree(work, ignore_errors=True)
    run_dir, staged = work / "run", work / "staged"
    staged.mkdir(parents=True)
    over = [f"data.source={json.dumps(str(data))}", f"data.test_rows={rows}", f"train.delta_every={delta_every}",
            "train.plots=false", *sets]  # fmt: skip
    cmd = [sys.executable, "-m", "tierec", "train", "--no-progress", "--run-dir", str(run_dir)]
    cmd += [a for o in over for a in ("--set", o)]
    with open(work / "train.log", "w") as log:
        subprocess.run(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, check=True)
    ckpts = run_dir / "checkpoints"
    fulls = sorted(p for p in ckpts.iterdir() if p.name.startswith("step_"))
    base = fulls[0]
    deltas = sorted(p for p in ckpts.iterdir() if p.name.startswith("delta_") and p.name.endswith(base.name[len("step"):]))
    if not deltas:
        raise SystemExit(f"the run wrote no delta of {base.name} (see {work / 'train.log'}): more steps, a smaller --delta-every")
    for p in fulls[1:]:
        shutil.rmtree(p)
    moved = []
    for p in deltas:
        moved.append(staged / p.name)
        os.replace(p, moved[-1])
    export_checkpoint(base, work / "export")
    return run_dir, work / "export", moved


def during_deltas(spans: list[tuple[float, float]], applied: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Latencies of the requests overlapping an application (start, end), and of the others."""
    during, other = [], []
    for t0, t1 in spans:
        (during if any(t0 < end and t1 > start for start, end in applied) else other).append(t1 - t0)
    return during, other


def run_deltas(args: argparse.Namespace, records: list[dict]) -> list[dict]:
    """The load on ``tierec serve --follow`` while the prepared deltas are renamed into the run (module docstring)."""
    run_dir, export, staged = prepare_deltas(args.deltas, args.data, args.rows, args.delta_every, args.train_set)
    proc, url = start_server(export, ["--follow", str(run_dir), "--poll", str(args.poll)])
    applied: list[tuple[float, float]] = []  # (start, end) of each application, perf_counter seconds
    log: list[str] = []

    def read_log() -> None:
        for line in proc.stdout:
            t = time.perf_counter()
            log.append(line.rstrip())
            m = APPLIED.match(line.strip())
            if m:  # the line is written when the new scorer is built; the swap follows on the event loop
                applied.append((t - float(m.group(3)), t))

    threading.Thread(target=read_log, daemon=True).start()
    stop = threading.Event()
    published: list[str] = []

    def publish() -> None:
        for p in staged:
            if stop.wait(args.delta_interval):
                return
            os.replace(p, run_dir / "checkpoints" / p.name)
            published.append(p.name)

    results = []
    try:
        size = int(args.sizes.split(",")[0])
        bodies = [json.dumps({"rows": [records[(i * size + j) % len(records)] for j in range(size)]}).encode()
                  for i in range(max(1, min(200, len(records) // size)))]  # fmt: skip
        spans: list[tuple[float, float]] = []
        publisher = threading.Thread(target=publish, daemon=True)
        r = load(url, bodies, args.connections, args.requests, args.seconds, args.warmup, spans, publisher.start)
        stop.set()
        publisher.join()
        time.sleep(args.poll + 0.5)  # the last delta published taken up, for the counts below
        during, other = during_deltas(spans, list(applied))
        version = json.loads(urllib.request.urlopen(url + "/version", timeout=30).read())
        r = {"rows_per_request": size, "connections": args.connections, **r, "rows_per_s": r["requests_per_s"] * size,
             "deltas_published": len(published), "deltas_applied": len(applied), "step_served": version["step"],
             "last_delta": version["delta"], "apply_s": [round(e - s, 4) for s, e in applied],
             "during_apply": {"requests": len(during), **percentiles(during)}, "other": {"requests": len(other), **percentiles(other)}}  # fmt: skip
        results.append(r)
        print(json.dumps(r), flush=True)
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=30)
    if len(applied) < len(published):
        print("\n".join(log[-20:]), file=sys.stderr)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", type=Path, help="an export to serve (started here on 127.0.0.1)")
    ap.add_argument("--url", help="an already running server instead, e.g. http://127.0.0.1:8000")
    ap.add_argument("--data", type=Path, default=CRITEO, help="raw Criteo file whose last --rows lines are the rows sent")
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--sizes", default="1,256", help="rows per request, comma-separated")
    ap.add_argument("--connections", type=int, default=2)
    ap.add_argument("--requests", type=int, default=2000, help="at most this many measured requests per size")
    ap.add_argument("--seconds", type=float, default=20.0, help="at most this long per size")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--deltas", type=Path, metavar="WORK",
                    help="measure while deltas are applied: train, export and serve --follow in WORK (emptied); first --sizes only")
    ap.add_argument("--delta-every", type=int, default=2, help="with --deltas: train.delta_every (default: 2)")
    ap.add_argument("--delta-interval", type=float, default=0.5, help="with --deltas: seconds between deltas published (default: 0.5)")
    ap.add_argument("--poll", type=float, default=0.2, help="with --deltas: tierec serve --poll (default: 0.2)")
    ap.add_argument("--train-set", action="append", default=[], metavar="KEY=VALUE",
                    help="with --deltas: another --set for the training run (repeatable), e.g. train.max_steps=40")
    args = ap.parse_args()
    if sum(x is not None for x in (args.export, args.url, args.deltas)) != 1:
        raise SystemExit("give one of --export, --url, --deltas")
    lines = args.data.read_text().splitlines()[-args.rows :]
    records = [{k: v for k, v in zip(CRITEO_COLUMNS, line.split("\t")) if k != "label"} for line in lines]
    if args.deltas is not None:
        results = run_deltas(args, records)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1) + "\n")
        return
    proc = None
    url = args.url
    if args.export is not None:
        proc, url = start_server(args.export)
    results = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            bodies = [json.dumps({"rows": [records[(i * size + j) % len(records)] for j in range(size)]}).encode()
                      for i in range(max(1, min(200, len(records) // size)))]  # fmt: skip
            r = {"rows_per_request": size, "connections": args.connections,
                 **load(url, bodies, args.connections, args.requests, args.seconds, args.warmup)}  # fmt: skip
            r["rows_per_s"] = r["requests_per_s"] * size
            results.append(r)
            print(json.dumps(r), flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
