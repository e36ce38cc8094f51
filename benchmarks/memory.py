"""MEMORY: bytes per resident row (weights, optimizer state, index) for each system.

Each system is built alone, runs one pass over the engine batches, and is
measured two ways: the bytes its tensors and index hold (accounted), and the
growth of the process's resident set (RSS) while it was built and trained.
Both are divided by its resident rows (every row for a static table; the rows
actually inserted for tierec) and compared with the raw bytes of one row's
weights plus row-wise Adagrad state, ``(dim + 1) * 4``. The bytes per
*touched* row (rows the batches used) show what static tables pay for rows
that are never seen.

>>> from benchmarks.memory import run_memory
>>> from benchmarks.workload import Workload
>>> res = run_memory(Workload(tables=2, rows=50, dim=4, batch=8, steps=2), ["tierec"])
>>> res["rows"][0]["system"]
'tierec'
"""

from __future__ import annotations

import gc
from pathlib import Path

from benchmarks.report import markdown_table
from benchmarks.systems import Missing, build, touched_rows
from benchmarks.workload import Workload, make_batches, upstream_grad


def rss_bytes() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_memory(w: Workload, systems: list[str]) -> dict:
    batches = make_batches(w)
    grad = upstream_grad(w)
    touched = touched_rows(batches)
    raw = (w.dim + 1) * 4  # bytes: weights + one float of row-wise Adagrad state
    rows = []
    if "tierec" in systems:  # numba compiles and caches outside the measured growth
        tiny = Workload(tables=2, rows=64, dim=w.dim, batch=8, steps=1)
        build("tierec", tiny, make_batches(tiny), upstream_grad(tiny))
    for name in systems:
        gc.collect()
        before = rss_bytes()
        s = build(name, w, batches, grad)
        if isinstance(s, Missing):
            rows.append({"system": name, "status": "missing", "error": s.error})
            continue
        if name != "tierec":  # tierec's constructor already made its pass
            for i in range(w.steps):
                s.step(i)
        gc.collect()
        grown = rss_bytes() - before
        resident = s.resident_rows()
        nbytes = s.nbytes()
        in_ram = s.resident_bytes() if hasattr(s, "resident_bytes") else nbytes
        rows.append(
            {
                "system": name,
                "status": "ok",
                "resident_rows": resident,
                "accounted_bytes": nbytes,
                "rss_growth_bytes": grown,
                "bytes_per_resident_row": nbytes / resident,
                "rss_per_resident_row": grown / resident,
                "ratio_to_raw": nbytes / resident / raw,
                "in_ram_bytes": in_ram,
                "in_ram_per_resident_row": in_ram / resident,
                "in_ram_ratio_to_raw": in_ram / resident / raw,
                "bytes_per_touched_row": nbytes / touched,
            }
        )
        if name == "tierec":
            rows[-1]["breakdown_per_row"] = _tierec_breakdown(s.coll, resident)
        del s
        gc.collect()
    return {"workload": w.as_dict(), "touched_rows": touched, "raw_bytes_per_row": raw, "rows": rows}


def _tierec_breakdown(coll, resident: int) -> dict[str, float]:
    """Bytes per resident row: used weights+state, capacity slack, index."""
    out = {"weights_state_used": 0.0, "capacity_slack": 0.0, "index": 0.0, "capacity_slack_in_ram": 0.0, "index_in_ram": 0.0}
    for g in coll.groups:
        per = g.bytes_per_row()
        cap = g.weights.shape[0]
        out["weights_state_used"] += g.num_rows * per / resident
        out["capacity_slack"] += (cap - g.num_rows) * per / resident
        out["index"] += g.index.nbytes() / resident
        out["index_in_ram"] += g.index.resident_nbytes() / resident
        out["capacity_slack_in_ram"] += (g.resident_nbytes() - g.index.resident_nbytes() - g.num_rows * per) / resident
    return out


def memory_markdown(res: dict) -> str:
    w = res["workload"]
    title = (
        f"MEMORY {w['tables']} tables x {w['rows']:,} rows, dim {w['dim']}, after {w['steps']} batches of {w['batch']} "
        f"(zipf {w['zipf']}, {w['hot']}-hot; {res['touched_rows']:,} rows touched; raw row = {res['raw_bytes_per_row']} B)"
    )
    table = []
    for r in res["rows"]:
        if r["status"] != "ok":
            table.append([r["system"], "missing", "-", "-", "-", "-", "-", "-", r["error"]])
            continue
        note = ""
        if "breakdown_per_row" in r:
            b = r["breakdown_per_row"]
            note = (
                f"allocated: used {b['weights_state_used']:.1f} + slack {b['capacity_slack']:.1f} + index {b['index']:.1f} B; "
                f"in RAM: slack {b['capacity_slack_in_ram']:.1f} + index {b['index_in_ram']:.1f} B"
            )
        table.append(
            [
                r["system"],
                f"{r['resident_rows']:,}",
                r["bytes_per_resident_row"],
                r["ratio_to_raw"],
                r["in_ram_per_resident_row"],
                r["in_ram_ratio_to_raw"],
                r["rss_per_resident_row"],
                r["bytes_per_touched_row"],
                note,
            ]
        )
    hdr = [
        "system",
        "resident rows",
        "B/resident row (allocated)",
        "x raw",
        "B/resident row (in RAM)",
        "x raw (in RAM)",
        "RSS B/resident row",
        "B/touched row",
        "tierec breakdown",
    ]
    return f"**{title}**\n\n" + markdown_table(hdr, table)
