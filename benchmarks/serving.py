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
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from tierec.data.schema import CRITEO_COLUMNS

CRITEO = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "criteo" / "train_head10000.txt"


def start_server(export: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "tierec", "serve", str(export), "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
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


def load(url: str, bodies: list[bytes], connections: int, requests: int, seconds: float, warmup: int) -> dict:
    """Closed-loop load over ``connections`` keep-alive connections; latencies of the measured requests."""
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
            dt = time.perf_counter() - t0
            with lock:
                if r.status != 200:
                    state["errors"] += 1
                if measured:
                    latencies.append(dt)
        conn.close()

    # warm-up first (one connection), then the measured run with a deadline
    for b in bodies[:warmup]:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("POST", "/score", b, {"Content-Type": "application/json"})
        conn.getresponse().read()
        conn.close()
    state["sent"] = warmup
    stop_at[0] = time.monotonic() + seconds
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = np.array(latencies) * 1000.0
    return {"requests": int(lat.size), "errors": state["errors"], "seconds": wall, "requests_per_s": lat.size / wall,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)), "max_ms": float(lat.max())}  # fmt: skip


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
    args = ap.parse_args()
    if (args.export is None) == (args.url is None):
        raise SystemExit("give --export or --url")
    lines = args.data.read_text().splitlines()[-args.rows :]
    records = [{k: v for k, v in zip(CRITEO_COLUMNS, line.split("\t")) if k != "label"} for line in lines]
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
