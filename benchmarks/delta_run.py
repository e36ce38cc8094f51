"""Delta checkpoints of a real training run: rows changed and bytes against the full checkpoint.

``benchmarks/delta_bytes.py`` measures a table where a chosen share of rows changed; this trains the
Criteo sample (``../shared/data/criteo/train_head10000.txt``, the size-chosen defaults) with a full
checkpoint every ``--full-every`` steps and a delta every ``d`` steps for each ``--every d``, and
reads what each run published: per delta, the rows it carries (ids of its row files), the rows of
its base checkpoint, and the bytes of both directories.

    python -m benchmarks.delta_run --work /tmp/delta_run --every 1,4,8 --json docs/bench/delta_run.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from safetensors import safe_open

CRITEO = Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo" / "train_head10000.txt"


def rows_in(ckpt: Path) -> int:
    """Rows (ids of every table) in a checkpoint's or delta's row files."""
    n = 0
    for f in sorted(ckpt.glob("rows-*.safetensors")):
        with safe_open(str(f), "pt") as st:
            n += sum(st.get_slice(k).get_shape()[0] for k in st.keys() if k == "ids" or k.endswith(".ids"))
    return n


def size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def run(work: Path, every: int, full_every: int, data: Path) -> dict:
    run_dir = work / f"every{every}"
    cmd = [sys.executable, "-m", "tierec", "train", "--run-dir", str(run_dir), "--overwrite", "--no-progress",
           "--set", f"data.source={json.dumps(str(data))}", "--set", f"train.checkpoint_every={full_every}",
           "--set", f"train.delta_every={every}"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    ckpts = run_dir / "checkpoints"
    fulls = {int(p.name.split("_")[1]): p for p in ckpts.glob("step_*")}
    deltas = []
    for d in sorted(ckpts.glob("delta_*")):
        _, step, _, base = d.name.split("_")
        b = fulls[int(base)]
        deltas.append({"delta": d.name, "steps_since_previous": every, "rows": rows_in(d), "base_rows": rows_in(b),
                       "bytes": size(d), "base_bytes": size(b)})
    share = [x["rows"] / x["base_rows"] for x in deltas]
    nbytes = [x["bytes"] / x["base_bytes"] for x in deltas]
    return {"every": every, "full_every": full_every, "run_wall_s": wall, "deltas": deltas,
            "median_rows_share": statistics.median(share) if share else None,
            "median_bytes_share": statistics.median(nbytes) if nbytes else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks.delta_run", description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=CRITEO)
    ap.add_argument("--every", default="1,4,8", help="steps between deltas, one run each")
    ap.add_argument("--full-every", type=int, default=24, help="steps between full checkpoints")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if not a.data.exists():
        print(f"{a.data}: not found", file=sys.stderr)
        return 2
    out = {"data": str(a.data.name), "runs": [run(a.work, int(e), a.full_every, a.data) for e in a.every.split(",")]}
    for r in out["runs"]:
        print(f"delta every {r['every']} steps: {len(r['deltas'])} deltas, rows {r['median_rows_share']:.1%} "
              f"of the base's, bytes {r['median_bytes_share']:.1%} (medians)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
