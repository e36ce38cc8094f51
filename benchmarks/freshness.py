"""Freshness: seconds from a training step to the served scores reflecting it, ``--follow`` on both sides.

On one machine: ``tierec train --follow`` on a directory (synthetic Criteo-shaped
files, ``--rows`` each, written under ``--work``), ``tierec export`` of its first
checkpoint, ``tierec serve EXPORT --follow RUN`` on a free local port. Then, for
each of ``--files`` more files: the file is renamed into the directory, and
``GET /version`` is asked every 10 ms until the served step is the step that
file ends at (the trainer publishes a delta when a file is done). Per file:

- ``from_step_s``: from the file's last training step (the delta's ``saved_at``,
  taken when the step is done) to the first answer naming that step, after which
  every request is scored with it (``applied_at`` is when the server swapped it in);
- ``from_arrival_s``: from the rename into the directory (the trainer's wait, the
  file read and trained, then the above);
- whether the scores of ``--probe`` fixed rows changed.

At the end the trainer is stopped with SIGTERM (it saves a full checkpoint at the
last step), that checkpoint is exported, and the served scores are compared with
its scorer's (``max_abs_diff_vs_export``). Prints one JSON object.

    python -m benchmarks.freshness --work /tmp/fresh --json docs/bench/freshness-2026-11-26.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.export_precision import held_out, write_synthetic_criteo
from tierec.serving.export import export_checkpoint
from tierec.serving.scorer import Scorer

REPO = Path(__file__).resolve().parents[1]


def _get(url: str, body: object | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _wait(check, timeout: float, what: str, step_s: float = 0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except OSError:
            got = None
        if got:
            return got
        time.sleep(step_s)
    raise SystemExit(f"timed out waiting for {what}")


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor()}, {os.cpu_count()} cores"


def run(args: argparse.Namespace) -> dict:
    work: Path = args.work
    shutil.rmtree(work, ignore_errors=True)
    stream, staged, run_dir, export = work / "stream", work / "staged", work / "run", work / "export"
    stream.mkdir(parents=True)
    staged.mkdir()
    for i in range(args.files + 1):
        write_synthetic_criteo(staged / f"part-{i:03d}.txt", args.rows, seed=8, first=i * args.rows)  # one planted model
    probe, _ = held_out(staged / f"part-{args.files:03d}.txt", args.probe)
    steps_per_file = math.ceil(args.rows / args.batch)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    sets = [f"data.source={json.dumps(str(stream))}", f"train.batch_size={args.batch}", f"embedding.dim={args.dim}",
            "train.delta_every=1000000", "data.follow_settle_s=0", f"data.follow_poll_s={args.train_poll}",
            "train.plots=false"]  # fmt: skip
    train_cmd = [sys.executable, "-m", "tierec", "train", "--follow", "--no-progress", "--run-dir", str(run_dir)]
    train_cmd += [a for s in sets for a in ("--set", s)]
    os.replace(staged / "part-000.txt", stream / "part-000.txt")
    trainer = subprocess.Popen(train_cmd, env=env, stdout=open(work / "train.log", "w"), stderr=subprocess.STDOUT)
    server = None
    try:
        ckpts = run_dir / "checkpoints"
        _wait(lambda: ckpts.is_dir() and any(p.name.startswith("step_") for p in ckpts.iterdir()), 300, "the first checkpoint")
        export_checkpoint(run_dir, export)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        serve_cmd = [sys.executable, "-m", "tierec", "serve", str(export), "--port", str(port), "--follow", str(run_dir),
                     "--poll", str(args.serve_poll)]  # fmt: skip
        server = subprocess.Popen(serve_cmd, env=env, stdout=open(work / "serve.log", "w"), stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        start = _wait(lambda: _get(url + "/version"), 300, "the server")
        step = int(start["step"])
        before = _get(url + "/score", {"rows": probe})["scores"]
        files = []
        for i in range(1, args.files + 1):
            target = step + steps_per_file
            name = f"part-{i:03d}.txt"
            arrived = time.time()
            os.replace(staged / name, stream / name)
            seen = _wait(lambda t=target: (v := _get(url + "/version"))["step"] >= t and (v, time.time()), 300, f"step {target}")
            version, seen_at = seen
            after = _get(url + "/score", {"rows": probe})["scores"]
            delta = version.get("delta") or {}
            files.append({"file": name, "step": version["step"], "publication": delta.get("name") or version.get("checkpoint"),
                          "from_step_s": seen_at - delta["saved_at"], "saved_to_applied_s": delta["applied_at"] - delta["saved_at"],
                          "from_arrival_s": seen_at - arrived, "scores_changed": bool(np.abs(np.subtract(after, before)).max() > 0)})  # fmt: skip
            print(json.dumps(files[-1]), flush=True)
            before, step = after, int(version["step"])
        trainer.send_signal(signal.SIGTERM)  # saves a full checkpoint at the last step, exits 143
        trainer.wait(timeout=300)
        served = np.array(_get(url + "/score", {"rows": probe})["scores"])
        export_checkpoint(run_dir, work / "export-last")
        reference = Scorer.load(work / "export-last").score(probe)
    finally:
        for proc in (trainer, server):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)

    def med(key: str) -> float:
        return statistics.median(f[key] for f in files)

    return {
        "host": _cpu(),
        "date": time.strftime("%Y-%m-%d"),
        "command": "python -m benchmarks.freshness " + " ".join(sys.argv[1:]),
        "rows_per_file": args.rows, "batch_size": args.batch, "steps_per_file": steps_per_file, "dim": args.dim,
        "train_poll_s": args.train_poll, "serve_poll_s": args.serve_poll,
        "median_from_step_s": med("from_step_s"), "max_from_step_s": max(f["from_step_s"] for f in files),
        "median_saved_to_applied_s": med("saved_to_applied_s"), "median_from_arrival_s": med("from_arrival_s"),
        "trainer_exit_status": trainer.returncode,
        "max_abs_diff_vs_export": float(np.abs(served - reference).max()),
        "files": files,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="directory for the stream, run, export and logs (emptied)")
    ap.add_argument("--files", type=int, default=5, help="files published after the first (default: 5)")
    ap.add_argument("--rows", type=int, default=2048, help="rows per file (default: 2048)")
    ap.add_argument("--batch", type=int, default=512, help="train.batch_size (default: 512)")
    ap.add_argument("--dim", type=int, default=16, help="embedding.dim (default: 16)")
    ap.add_argument("--probe", type=int, default=64, help="rows scored before and after each file (default: 64)")
    ap.add_argument("--train-poll", type=float, default=0.2, help="data.follow_poll_s (default: 0.2)")
    ap.add_argument("--serve-poll", type=float, default=0.2, help="tierec serve --poll (default: 0.2)")
    ap.add_argument("--json", type=Path, help="write the result here too")
    args = ap.parse_args()
    result = run(args)
    print(json.dumps({k: v for k, v in result.items() if k != "files"}, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
