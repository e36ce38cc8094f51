"""Collect JSON results of ``benchmarks.run`` into one markdown report with the issue's targets.

    python -m benchmarks.summarize runs/bench/*.json > summary.md

Each target is judged on the ratio of medians (the headline) and, because the
machine is shared, also on the best-of-repeats ratio.

>>> from benchmarks.summarize import verdict
>>> verdict(1.6, 1.5), verdict(1.2, 1.5)
('met', 'missed')
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.report import markdown_table

# (what, comparison, workload filter, peer, threshold): tierec speedup >= threshold
ENGINE_TARGETS = [
    ("engine dim 16, Zipf 1.1, 1-hot", {"dim": 16, "zipf": 1.1, "hot": 1}, "fbgemm", 1.5),
    ("engine dim 16, Zipf 1.1, 1-hot", {"dim": 16, "zipf": 1.1, "hot": 1}, "torch", 5.0),
    ("engine dim 16, uniform, 1-hot", {"dim": 16, "zipf": 0.0, "hot": 1}, "fbgemm", 1.0),
    # within 2.5x of the floor: floor_time / tierec_time >= 1 / 2.5
    ("engine dim 16, Zipf 1.1, 1-hot", {"dim": 16, "zipf": 1.1, "hot": 1}, "floor", 0.4),
]
E2E_TARGETS = [("torchrec", 1.3), ("torch", 5.0)]
AUC_TOLERANCE = 0.002
MEMORY_TARGET = 1.25


def verdict(value: float, threshold: float) -> str:
    return "met" if value >= threshold else "missed"


def _matches(workload: dict, want: dict) -> bool:
    return all(abs(float(workload[k]) - v) < 1e-9 for k, v in want.items())


def _threads(doc: dict) -> int:
    return int(doc["machine"].get("numba_threads", 0))


def targets(docs: list[dict]) -> list[list]:
    rows = []
    for doc in docs:
        th = _threads(doc)
        eng = doc["results"].get("engine")
        if eng:
            by = {r["system"]: r for r in eng["rows"] if r["status"] == "ok"}
            for what, want, peer, thr in ENGINE_TARGETS:
                if _matches(eng["workload"], want) and peer in by:
                    r = by[peer]
                    target = f"tierec >= {thr}x {peer}" if peer != "floor" else "tierec within 2.5x of the floor"
                    rows.append(
                        [what, th, target, r["tierec_speedup"], r["tierec_speedup_best"],
                         verdict(r["tierec_speedup"], thr), verdict(r["tierec_speedup_best"], thr)]
                    )
        e2e = doc["results"].get("e2e")
        if e2e:
            by = {r["system"]: r for r in e2e["rows"] if r["status"] == "ok"}
            for peer, thr in E2E_TARGETS:
                if peer in by:
                    r = by[peer]
                    best = r["best_s"] / by["tierec"]["best_s"]
                    rows.append(["e2e DLRM", th, f"tierec >= {thr}x {peer}", r["tierec_speedup"], best,
                                 verdict(r["tierec_speedup"], thr), verdict(best, thr)])
                    gap = abs(r["auc_minus_tierec"])
                    ok = "met" if gap <= AUC_TOLERANCE else "missed"
                    rows.append(["e2e DLRM", th, f"abs(AUC - AUC({peer})) <= {AUC_TOLERANCE}", gap, gap, ok, ok])
        mem = doc["results"].get("memory")
        if mem:
            for r in mem["rows"]:
                if r["system"] == "tierec" and r["status"] == "ok":
                    # Bytes allocated, and (runs since 2026-11-24 evening) bytes in RAM: spare capacity
                    # that no row has reached is address space, not memory.
                    for what, key in (("allocated", "ratio_to_raw"), ("in RAM", "in_ram_ratio_to_raw")):
                        if key not in r:
                            continue
                        x = r[key]
                        ok = "met" if x <= MEMORY_TARGET else "missed"
                        target = f"B/row ({what}) <= {MEMORY_TARGET}x raw"
                        rows.append([f"memory dim {mem['workload']['dim']}", "-", target, x, x, ok, ok])
    return rows


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    docs = [json.loads(p.read_text()) for p in paths]
    for p, doc in zip(paths, docs):
        th = _threads(doc)
        print(f"### {p.stem} ({th} thread{'s' if th != 1 else ''})\n")
        print(f"`python -m benchmarks.run {' '.join(doc['argv'])}`\n")
        print(doc["markdown"] + "\n")
    hdr = ["comparison", "threads", "target", "value (medians)", "value (best)", "verdict (medians)", "verdict (best)"]
    print("### Targets\n")
    print(markdown_table(hdr, targets(docs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
