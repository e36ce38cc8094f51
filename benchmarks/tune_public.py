"""Issue 25's tune table: ``tierec tune --trials 20`` on the public files, beside tuned LR and item popularity.

For each file of :mod:`benchmarks.public_data` (``../shared/data``, skipped when absent) this does what a new
user does: ``tierec inspect FILE --out SCHEMA.toml``, then ``tierec tune --config SCHEMA.toml --run-dir W/F
--trials 20`` (a subprocess, nothing else set but ``--model``; without it the study searches the model too), and
records its wall time, the trials complete / pruned / failed, the best trial's parameters and the final test AUC
that tune prints once (the best config trained on train + validation). Beside it, on the same split, the
baselines of :func:`benchmarks.public_data.baselines` (one-hot logistic regression with C tuned over
``public_data.CS``, item popularity): computed again, or with ``--baselines DIR`` read from public_data's JSON
of that file when its schema is the one inspect writes now (the same split, rows and hashing).

Files run in the order given (``--files``; default smallest first). ``--deadline HH:MM`` (UTC) passes each
tune a ``--timeout``: the time left to the deadline, shared among the files still to run, less a reserve for
the final run; a file that has not finished 20 trials by then records how many did (and the seconds per trial).

    python -m benchmarks.tune_public --work /tmp/tune25 --baselines docs/bench/issue25_public \\
        --json-dir docs/bench/issue25_tune_models/seed0 --host "AMD EPYC 2 cores KVM" --date 2026-12-06
    python -m benchmarks.tune_public --table docs/bench/issue25_tune_models/seed0/*.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.public_data import FILES, SHARED, _no_values, baselines, inspect

ORDER = ("criteo", "amazon", "frappe", "lastfm", "movielens")  # by file size: the small ones finish first
ROOT = Path(__file__).resolve().parents[1]


def recorded_baselines(directory: Path | None, name: str, schema: Path) -> tuple[dict, str] | None:
    """public_data's baselines of ``name`` when that run's schema is the one inspect wrote now."""
    path = directory / f"{name}.json" if directory else None
    if path is None or not path.is_file():
        return None
    for r in json.loads(path.read_text())["results"]:
        if r.get("file") == name and r["schema"] == _no_values(schema.read_text()):
            return r["baselines"], str(path)
    return None


def tune(schema: Path, run_dir: Path, trials: int, timeout: float, log: Path, seed: int = 0,
         model: str = "") -> tuple[int, float, str]:
    """``tierec tune`` as a user runs it (a fresh process); exit status, wall seconds, its output."""
    cmd = [sys.executable, "-m", "tierec.cli", "tune", "--config", str(schema), "--run-dir", str(run_dir),
           "--trials", str(trials), "--no-progress"] + (["--timeout", f"{timeout:.0f}"] if timeout else []) + (
           ["--set", f"tune.seed={seed}"] if seed else []) + (["--set", f"model.name={model}"] if model else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    return code, time.perf_counter() - t0, log.read_text()


def trial_times(run_dir: Path) -> dict:
    """Seconds of each finished trial (training only) and of the trials' phase (first start to last end)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="tierec", storage=f"sqlite:///{(run_dir / 'study.db').resolve()}")
    done = [t for t in study.get_trials(deepcopy=False) if t.datetime_complete is not None]
    if not done:
        return {"trial_seconds": [], "trials_phase_s": 0.0}
    phase = (max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)).total_seconds()
    return {"trial_seconds": [round(t.user_attrs.get("seconds", float("nan")), 2) for t in done],
            "trial_states": [t.state.name.lower() for t in done], "trials_phase_s": round(phase, 1)}


def run_file(name: str, a: argparse.Namespace, timeout: float) -> dict | None:
    path, item = FILES[name]
    if not path.is_file():
        print(f"{name}: {path} is absent, skipped", flush=True)
        return None
    schema = inspect(path, a.work / f"{name}.toml")
    got = recorded_baselines(a.baselines, name, schema)
    base, base_from = got if got else (baselines(schema, item), "computed by this run (benchmarks.public_data.baselines)")
    print(f"{name}: {base['train_rows']:,} / {base['test_rows']:,} rows; LR {base['logistic_regression_auc']:.4f}, "
          f"item popularity {base['item_popularity_auc']:.4f} ({base_from}); tune --trials {a.trials}"
          + (f" --timeout {timeout:.0f}" if timeout else ""), flush=True)
    run_dir = a.work / name
    code, wall, out = tune(schema, run_dir, a.trials, timeout, a.work / f"{name}.log", a.tune_seed, a.model)
    if code != 0:
        print(out[-2000:])
        raise SystemExit(f"{name}: tierec tune exited {code} (log {a.work / f'{name}.log'})")
    s = json.loads((run_dir / "tune_summary.json").read_text())
    times = trial_times(run_dir)
    finished = s["complete"] + s["pruned"]
    gap = s["test_auc"] - base["logistic_regression_auc"]
    per_100k = wall * 100_000 / base["train_rows"]
    r = {"file": name, "source": str(path.relative_to(SHARED.parent.parent)), "model": a.model or "searched",
         "command": f"tierec inspect {path.name} --out schema.toml; tierec tune --config schema.toml --run-dir W/{name} "
                    f"--trials {a.trials}" + (f" --timeout {timeout:.0f}" if timeout else "")
                    + (f" --set tune.seed={a.tune_seed}" if a.tune_seed else "")
                    + (f" --set model.name={a.model}" if a.model else ""), "tune_seed": a.tune_seed,
         "train_rows": base["train_rows"], "test_rows": base["test_rows"],
         "trials_asked": a.trials, "trials_finished": finished, "complete": s["complete"], "pruned": s["pruned"],
         "failed": s["failed"], "timed_out": s.get("timed_out", False), "timeout_s": round(timeout),
         "tune_wall_s": round(wall, 1), "tune_wall_s_per_100k_train_rows": round(per_100k, 1),
         "seconds_per_trial": round(times["trials_phase_s"] / max(len(times["trial_seconds"]), 1), 1),
         "outside_trials_s": round(wall - times["trials_phase_s"], 1), **times,
         "best_trial": s["best_trial"], "best_params": s["best_params"], "best_validation_auc": s["best_validation_auc"],
         "test_auc": s["test_auc"], "test_logloss": s["test_logloss"], "gap_to_lr": gap,
         "at_or_above_lr": gap >= 0, "above_item_popularity": s["test_auc"] > base["item_popularity_auc"],
         "budget_s": budget_s(base["train_rows"]), "within_budget": wall <= budget_s(base["train_rows"]), "baselines_from": base_from, "baselines": base,
         "schema": _no_values(schema.read_text())}
    print(f"  test AUC {s['test_auc']:.4f} ({gap:+.4f} to LR); {finished} trials ({s['complete']} complete, "
          f"{s['pruned']} pruned, {s['failed']} failed) in {wall:.0f} s ({per_100k:.0f} s per 100k training rows)", flush=True)
    return r


def budget_s(train_rows: int) -> float:
    """Issue 25's wall-time bound: 10 minutes per 100,000 training rows, and 10 minutes for any smaller file."""
    return 600.0 * max(1.0, train_rows / 100_000)


def timeout_for(deadline: dt.datetime | None, files_left: int, reserve: float) -> float:
    """The time to the deadline shared among the files left, less the final run's reserve (0: no deadline)."""
    if deadline is None:
        return 0.0
    left = (deadline - dt.datetime.now(dt.timezone.utc)).total_seconds()
    return max(60.0, left / files_left - reserve)


def markdown(paths: list[Path]) -> str:
    out = ["| file (train / test rows) | tuned, test AUC (to LR; model) | LR | item popularity | trials: complete / pruned "
           "(of 20) | tune wall time (per trial) | bound (10 min per 100k rows) |", "|---|---|---|---|---|---|---|"]
    for p in paths:
        r = json.loads(p.read_text())["result"]
        b = r["baselines"]
        late = " (timed out)" if r["timed_out"] else ""
        model = r["best_params"].get("model", r["model"])
        out.append(f"| {r['file']} ({r['train_rows']:,} / {r['test_rows']:,}) | {r['test_auc']:.4f} ({r['gap_to_lr']:+.4f}; {model}) "
                   f"| {b['logistic_regression_auc']:.4f} | {b['item_popularity_auc']:.4f} | {r['complete']} / {r['pruned']}{late} "
                   f"| {r['tune_wall_s']:.0f} s ({r['seconds_per_trial']:.1f} s) | {budget_s(r['train_rows']):.0f} s |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tune_public", description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, help="directory for the schemas, logs and tune run directories (created)")
    p.add_argument("--table", nargs="+", type=Path, help="print these JSON results as a markdown table, and stop")
    p.add_argument("--files", default=",".join(ORDER))
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--tune-seed", type=int, default=0, help="tune.seed (the sampler's; 0 is tune's default)")
    p.add_argument("--model", default="", help="model.name of the tuned runs (default: none set, tune searches the model)")
    p.add_argument("--baselines", type=Path, help="public_data's JSON directory (docs/bench/issue25_public) to read "
                                                  "the baselines from where the schema matches")
    p.add_argument("--deadline", help="HH:MM UTC today: each tune gets --timeout from the time left (see above)")
    p.add_argument("--reserve", type=float, default=120.0, help="seconds kept back per file for the final run")
    p.add_argument("--json-dir", type=Path, help="write NAME.json here after each file")
    p.add_argument("--host", default="")
    p.add_argument("--date", default="")
    p.add_argument("--note", default="", help="what else ran beside it, recorded with the wall times")
    a = p.parse_args(argv)
    if a.table:
        print(markdown(a.table))
        return 0
    if a.work is None:
        p.error("--work is required (or --table)")
    a.work.mkdir(parents=True, exist_ok=True)
    deadline = None
    if a.deadline:
        h, m = (int(x) for x in a.deadline.split(":"))
        deadline = dt.datetime.now(dt.timezone.utc).replace(hour=h, minute=m, second=0, microsecond=0)
    names = a.files.split(",")
    command = "python -m benchmarks.tune_public " + " ".join(sys.argv[1:] if argv is None else argv)
    for i, name in enumerate(names):
        r = run_file(name, a, timeout_for(deadline, len(names) - i, a.reserve))
        if r and a.json_dir:
            a.json_dir.mkdir(parents=True, exist_ok=True)
            doc = {"host": a.host, "date": a.date, "command": command,
                   "note": a.note, "result": r}
            (a.json_dir / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
