"""ENGINE comparison: lookup + backward + row-wise Adagrad on the same batches and tables.

Systems that do not fit in memory together are split into groups; tierec runs
in every group, so each peer's ratio is measured side by side with tierec in
the same run of repeats.

>>> from benchmarks.engine import run_engine
>>> from benchmarks.workload import Workload
>>> res = run_engine(Workload(tables=2, rows=50, dim=4, batch=8, steps=2), ["tierec", "floor"], repeats=2)
>>> [r["system"] for r in res["rows"]]
['tierec', 'floor']
"""

from __future__ import annotations

import gc

import numpy as np

from benchmarks.report import markdown_table
from benchmarks.systems import ENGINE_SYSTEMS, Missing, build, estimated_bytes, touched_rows
from benchmarks.timing import alternate, median, paired_ratio, spread
from benchmarks.workload import Workload, make_batches, upstream_grad


def plan_groups(peers: list[str], w: Workload, budget: int) -> list[list[str]]:
    """First-fit grouping of peers so each group (plus tierec) stays under ``budget`` bytes."""
    room = budget - estimated_bytes("tierec", w)
    groups: list[list[str]] = []
    used: list[int] = []
    for p in sorted(peers, key=lambda p: -estimated_bytes(p, w)):
        need = estimated_bytes(p, w)
        for gi in range(len(groups)):
            if used[gi] + need <= room:
                groups[gi].append(p)
                used[gi] += need
                break
        else:
            groups.append([p])
            used.append(need)
    return groups or [[]]


def run_engine(w: Workload, systems: list[str], repeats: int, mem_budget: int = 1 << 62) -> dict:
    unknown = [s for s in systems if s not in ENGINE_SYSTEMS]
    if unknown:
        raise ValueError(f"unknown engine systems {unknown}; choose from {list(ENGINE_SYSTEMS)}")
    batches = make_batches(w)
    grad = upstream_grad(w)
    n_ids = w.ids_per_batch()
    stats = {
        "ids_per_batch": n_ids,
        "unique_per_batch": float(np.mean([b.unique_rows.numel() for b in batches])),
        "touched_rows": touched_rows(batches),
    }
    peers = [s for s in systems if s not in ("tierec", "tierec-cold")]
    groups = plan_groups(peers, w, mem_budget)
    if "tierec-cold" in systems:
        groups[0].append("tierec-cold")
    rows: list[dict] = []
    loads: list[float] = []
    for gi, group in enumerate(groups):
        built = [build(n, w, batches, grad) for n in ["tierec", *group]]
        ready = [s for s in built if not isinstance(s, Missing)]
        for s in built:
            if isinstance(s, Missing):
                rows.append({"system": s.name, "status": "missing", "error": s.error, "group": gi})
        tm = alternate(ready, repeats, lambda s, r: [s.step(i) for i in range(w.steps)])
        loads.extend(tm.load)
        ref_wall, ref_cpu = tm.wall["tierec"], tm.cpu["tierec"]
        for s in ready:
            if s.name == "tierec" and ("tierec" not in systems or gi > 0):
                continue  # tierec's own row comes from the first group
            wall, cpu = tm.wall[s.name], tm.cpu[s.name]
            t = median(wall)
            row = {
                "system": s.name,
                "status": "ok",
                "group": gi,
                "times_s": wall,
                "cpu_s": cpu,
                "median_s": t,
                "best_s": min(wall),
                "cpu_median_s": median(cpu),
                "spread": spread(wall),
                "samples_per_s": w.steps * w.batch / t,
                "tierec_samples_per_s": w.steps * w.batch / median(ref_wall),
                "tierec_speedup": t / median(ref_wall),  # > 1: tierec is faster (ratio of medians)
                "tierec_speedup_paired": paired_ratio(wall, ref_wall),
                "tierec_speedup_best": min(wall) / min(ref_wall),
                "tierec_speedup_cpu": median(cpu) / median(ref_cpu),
            }
            if s.name == "tierec":
                row["warm_pass_s"] = s.warm_seconds
                row["resident_rows"] = s.resident_rows()
            rows.append(row)
        del built, ready, s  # s: the loop variable still holds the group's last system (GBs of tables)
        gc.collect()
    order = {n: i for i, n in enumerate(systems)}
    rows.sort(key=lambda r: order.get(r["system"], 99))
    stats["loadavg_at_repeats"] = loads
    return {"workload": w.as_dict(), "repeats": repeats, "groups": groups, "stats": stats, "rows": rows}


def engine_markdown(res: dict) -> str:
    w = res["workload"]
    title = (
        f"ENGINE {w['tables']} tables x {w['rows']:,} rows, dim {w['dim']}, batch {w['batch']}, "
        f"zipf {w['zipf']}, {w['hot']}-hot, {w['steps']} steps x {res['repeats']} repeats "
        f"(unique ids per batch {res['stats']['unique_per_batch']:,.0f} of {res['stats']['ids_per_batch']:,})"
    )
    table = []
    for r in res["rows"]:
        if r["status"] != "ok":
            table.append([r["system"], "missing", *["-"] * 7, r["error"]])
            continue
        note = "" if r["system"] != "tierec" else "reference"
        if len(res["groups"]) > 1 and r["system"] != "tierec":
            note = f"group {r['group']}: tierec {r['tierec_samples_per_s']:,.0f}/s alongside"
        steps = w["steps"]
        table.append(
            [
                r["system"],
                f"{r['samples_per_s']:,.0f}",
                r["median_s"] * 1000 / steps,
                r["best_s"] * 1000 / steps,
                r["cpu_median_s"] * 1000 / steps,
                r["tierec_speedup"],
                r["tierec_speedup_paired"],
                r["tierec_speedup_best"],
                r["tierec_speedup_cpu"],
                note,
            ]
        )
    hdr = [
        "system",
        "samples/s (median)",
        "ms/step median",
        "ms/step best",
        "CPU ms/step",
        "tierec speedup (medians)",
        "(paired)",
        "(best)",
        "(CPU)",
        "note",
    ]
    loads = res["stats"].get("loadavg_at_repeats", [])
    load = f"; load average during repeats {min(loads):.1f}-{max(loads):.1f} on {_cores()} cores" if loads else ""
    return f"**{title}**{load}; {omp_wait_note()}\n\n" + markdown_table(hdr, table)


def omp_wait_note() -> str:
    """The OpenMP wait policy in force, which changes the peers' 2-thread times several fold."""
    import os

    policy = os.environ.get("OMP_WAIT_POLICY", "").upper() or "unset (OpenMP's default: spin a while, then sleep)"
    if policy == "PASSIVE":
        return ("OpenMP waits PASSIVE (each torch/FBGEMM parallel region wakes sleeping threads: "
                "on a quiet machine also run with OMP_WAIT_POLICY=ACTIVE)")
    return f"OpenMP waits {policy}"


def _cores() -> int:
    import os

    return os.cpu_count() or 0
