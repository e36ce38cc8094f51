"""Issue 25: does the schema ``tierec inspect`` writes train as well as one written by hand?

For each public file in ``../shared/data`` (skipped when absent) this trains the same
model and seeds twice through ``tierec train --config``: once with the schema
``tierec inspect FILE --out`` wrote (``benchmarks.public_data``'s path, nothing
edited), once with :data:`HAND`, the schema a user writes from the file's own
description (``../shared/data/README.md``: column names, separator, what the
columns mean) without looking at what inspect proposed. The task stays the same:
the label (rating >= 4), the split and the sampled negatives are those the file's
description asks for, so the two runs differ only where a person and inspect read
the columns differently (the names; Amazon's user id, which inspect leaves out as
near-unique; Frappe's price class, which inspect makes a feature of the item). The
verdict: the mean test AUC of the inspected schema within 0.005 of the hand-written
one's.

    python -m benchmarks.hand_schema --work /tmp/hs --seeds 0,1,2 --json docs/bench/issue25_public/hand_schema.json \\
        --host "..." --date 2026-11-27
    python -m benchmarks.hand_schema --table docs/bench/issue25_public/hand_schema.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks.public_data import FILES, SHARED, inspect, train

BOUND = 0.005  # the bound on |inspected - hand-written|

HAND = {
    "criteo": """[data]
source = "{source}"
format = "criteo"
[data.schema]
preset = "criteo"
""",
    "movielens": """[data]
source = "{source}"
format = "csv"
split = "column"
split_column = "timestamp"
[data.schema]
delimiter = "::"
header = false
columns = ["user", "movie", "rating", "timestamp"]
label = "rating"
label_threshold = 4
categorical = ["user", "movie"]
dense = []
""",
    "amazon": """[data]
source = "{source}"
format = "csv"
split = "column"
split_column = "Timestamp"
[data.schema]
label = "Rating"
label_threshold = 4
categorical = ["UserId", "ProductId"]
dense = []
""",
    "frappe": """[data]
source = "{source}"
format = "tsv"
negatives = 2
user_column = "user"
item_column = "item"
[data.schema]
categorical = ["user", "item", "daytime", "weekday", "isweekend", "homework", "cost", "weather", "country", "city"]
dense = []
""",
    "lastfm": """[data]
source = "{source}"
format = "tsv"
split = "hash"
negatives = 2
user_column = "userID"
item_column = "artistID"
[data.schema]
categorical = ["userID", "artistID"]
dense = []
""",
}


def markdown(path: Path) -> str:
    rows = json.loads(path.read_text())["results"]
    out = ["| file | model | inspected schema | hand-written schema | inspected - hand | within 0.005 |", "|---|---|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r['file']} | {r['model']} | {r['inspected']['mean']:.4f} | {r['hand']['mean']:.4f} | {r['difference']:+.4f} "
                   f"| {'yes' if abs(r['difference']) <= BOUND else 'no'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hand_schema", description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, help="directory for the schemas and runs (created)")
    p.add_argument("--table", type=Path, help="print this JSON result as a markdown table, and stop")
    p.add_argument("--files", default=",".join(HAND))
    p.add_argument("--models", default="dlrm")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--json", type=Path)
    p.add_argument("--host", default="")
    p.add_argument("--date", default="")
    a = p.parse_args(argv)
    if a.table:
        print(markdown(a.table))
        return 0
    if a.work is None:
        p.error("--work is required (or --table)")
    a.work.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.hand_schema " + " ".join(sys.argv[1:] if argv is None else argv)
    results = []
    for name in a.files.split(","):
        path = FILES[name][0]
        if not path.is_file():
            print(f"{name}: {path} is absent, skipped")
            continue
        schemas = {"inspected": inspect(path, a.work / f"{name}-inspected.toml"),
                   "hand": a.work / f"{name}-hand.toml"}
        schemas["hand"].write_text(HAND[name].format(source=path))
        for model in a.models.split(","):
            r: dict = {"file": name, "source": str(path.relative_to(SHARED.parent.parent)), "model": model,
                       "hand_schema": HAND[name].format(source=path.relative_to(SHARED.parent.parent))}
            for kind, schema in schemas.items():
                runs = []
                for seed in (int(s) for s in a.seeds.split(",")):
                    s = train(schema, model, seed, a.work / "runs" / f"{name}-{model}-{kind}-{seed}")
                    runs.append({"seed": seed, "test_auc": s["test_auc"], "test_rows": s["test_rows"]})
                    print(f"{name} {model} {kind:9s} seed {seed}: {s['test_auc']:.4f} ({s['test_rows']:,} test rows)", flush=True)
                r[kind] = {"runs": runs, "mean": statistics.fmean(x["test_auc"] for x in runs)}
            r["difference"] = r["inspected"]["mean"] - r["hand"]["mean"]
            print(f"{name} {model}: inspected {r['inspected']['mean']:.4f}, hand {r['hand']['mean']:.4f}, "
                  f"{r['difference']:+.4f}: {'within' if abs(r['difference']) <= BOUND else 'outside'} {BOUND}", flush=True)
            results.append(r)
            if a.json:
                a.json.parent.mkdir(parents=True, exist_ok=True)
                a.json.write_text(json.dumps({"host": a.host, "date": a.date, "command": command, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
