"""PNG plots of a run, drawn from its ``metrics.jsonl``: what `train` leaves at the end and `tierec report` redraws.

Four pictures go into the run directory (matplotlib, Agg backend: no display needed):

- ``loss_auc.png``: training loss over steps (raw faint, smoothed on top), and validation (or test) AUC over steps;
- ``throughput.png``: training samples/s between records (the first step, which compiles, left out);
- ``embedding.png``: embedding rows and bytes (tables, optimizer state, indexes) over steps;
- ``store_hit_rate.png``: the tiered store's hit rate over steps, only when tables are tiered.

They are written through :class:`~tierec.train.runfiles.RunFiles`: each whole
(a temporary renamed over the old one), never through a symbolic link and never
over a file tierec did not write (a user's own ``loss_auc.png`` is refused in
one line before any is drawn).

>>> import json, tempfile
>>> from pathlib import Path
>>> run = Path(tempfile.mkdtemp())
>>> rows = [{"kind": "train", "step": s, "loss": 0.6 - s / 1000, "samples_per_s": 1e4, "embedding_rows": 10 * s,
...          "embedding_bytes": 640 * s} for s in (1, 2, 3)]
>>> rows.append({"kind": "eval", "split": "validation", "step": 3, "auc": 0.7, "logloss": 0.5, "rows": 10})
>>> _ = (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
>>> [p.name for p in write_plots(run)]
['loss_auc.png', 'throughput.png', 'embedding.png']
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Callable

from tierec.train.runfiles import RunDirError, RunFiles

PLOT_FILES = ("loss_auc.png", "throughput.png", "embedding.png")
HIT_RATE_FILE = "store_hit_rate.png"


def plot_files(tiered: bool) -> tuple[str, ...]:
    """The names of the plots of a run (the hit rate's with tiered tables)."""
    return PLOT_FILES + ((HIT_RATE_FILE,) if tiered else ())


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl``; a missing file or a torn last line is a one-line error."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise RunDirError(f"{path}: no such file (is {run_dir} a run directory of `tierec train`?)")
    records = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise RunDirError(f"{path}:{n}: not a JSON record ({e.msg})") from None
    return records


def _series(records: list[dict[str, Any]], kind: str, key: str, get: Callable[[dict], Any] | None = None,
            **match: Any) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key`` (or ``get(record)``) in the records of ``kind`` (and the ``match`` fields),
    the latest per step."""
    get = get or (lambda r: r.get(key))
    by_step: dict[int, float] = {}
    for r in records:
        if r.get("kind") == kind and all(r.get(k) == v for k, v in match.items()) and get(r) is not None:
            by_step[int(r["step"])] = float(get(r))
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def smoothed(values: list[float], weight: float = 0.9) -> list[float]:
    """An exponential moving average, debiased at the start (as TensorBoard's smoothing).

    >>> [round(v, 3) for v in smoothed([1.0, 0.0, 0.0], 0.5)]
    [1.0, 0.333, 0.143]
    """
    out, avg = [], 0.0
    for i, v in enumerate(values, start=1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight**i))
    return out


def interval_rates(records: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """(steps, samples/s between consecutive train records), from their cumulative samples and busy seconds;
    metrics written before those fields existed give their cumulative rate.

    >>> interval_rates([{"kind": "train", "step": 1, "samples": 0, "busy_s": 0.0, "samples_per_s": 5.0},
    ...                 {"kind": "train", "step": 3, "samples": 200, "busy_s": 2.0, "samples_per_s": 100.0},
    ...                 {"kind": "train", "step": 5, "samples": 400, "busy_s": 2.5, "samples_per_s": 160.0}])
    ([3, 5], [100.0, 400.0])
    """
    train = [r for r in records if r.get("kind") == "train"]
    if not all("samples" in r and "busy_s" in r for r in train):
        return _series(records, "train", "samples_per_s")
    steps, rates = [], []
    for prev, cur in zip(train, train[1:]):
        seconds = cur["busy_s"] - prev["busy_s"]
        if seconds > 0 and cur["step"] > prev["step"]:
            steps.append(int(cur["step"]))
            rates.append((cur["samples"] - prev["samples"]) / seconds)
    return steps, rates


def _hit_rate(r: dict[str, Any]) -> float | None:
    return r["store"]["total"]["hit_rate"] if "store" in r else None


def write_plots(run_dir: str | Path) -> list[Path]:
    """Draw the run's plots into ``run_dir``; returns the files written (the store's only with tiered tables)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    files = RunFiles(run_dir)
    hit_rates = _series(records, "train", "hit_rate", _hit_rate)
    files.check(plot_files(tiered=bool(hit_rates[0])))  # all refused before one is drawn
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
        plt.close(fig)
        written.append(files.write(name, png.getvalue()))

    def line(ax: Any, xy: tuple[list[int], list[float]], label: str, **kw: Any) -> None:
        ax.plot(*xy, marker="o" if len(xy[0]) < 30 else None, markersize=3, label=label, **kw)

    fig, (loss_ax, auc_ax) = plt.subplots(1, 2, figsize=(10, 4))
    steps, losses = _series(records, "train", "loss")
    raw = loss_ax.plot(steps, losses, color="tab:blue", alpha=0.25, linewidth=0.8, label="training loss (batch mean)")[0]
    line(loss_ax, (steps, smoothed(losses)), "smoothed", color=raw.get_color())
    for split in ("validation", "test"):
        xy = _series(records, "eval", "auc", split=split)
        if xy[0]:
            line(auc_ax, xy, f"{split} AUC")
            line(loss_ax, _series(records, "eval", "logloss", split=split), f"{split} logloss", linestyle="--")
    loss_ax.set(xlabel="step", ylabel="logloss", title="loss")
    evals = len(_series(records, "eval", "auc")[0])
    auc_ax.set(xlabel="step", ylabel="AUC", title="AUC" if evals > 1 else "AUC (at the end only: train.eval_every = 0)")
    auc_ax.set_xlim(loss_ax.get_xlim())  # the same steps as the loss
    for ax in (loss_ax, auc_ax):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    save(fig, PLOT_FILES[0])

    fig, ax = plt.subplots(figsize=(6, 4))
    line(ax, interval_rates(records), "samples/s (between records)")
    ax.set(xlabel="step", ylabel="samples/s", title="training throughput")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    save(fig, PLOT_FILES[1])

    fig, rows_ax = plt.subplots(figsize=(6, 4))
    line(rows_ax, _series(records, "train", "embedding_rows"), "rows", color="tab:blue")
    rows_ax.set(xlabel="step", ylabel="embedding rows", title="embedding tables")
    rows_ax.set_ylim(bottom=0)
    bytes_ax = rows_ax.twinx()
    steps, values = _series(records, "train", "embedding_bytes")
    line(bytes_ax, (steps, [v / 2**20 for v in values]), "MiB", color="tab:orange", linestyle="--")
    bytes_ax.set(ylabel="MiB (rows, optimizer state, index)")
    bytes_ax.set_ylim(bottom=0)
    rows_ax.legend(*[a + b for a, b in zip(rows_ax.get_legend_handles_labels(), bytes_ax.get_legend_handles_labels())], loc="lower right")
    rows_ax.grid(alpha=0.3)
    save(fig, PLOT_FILES[2])

    steps, rates = hit_rates
    if steps:
        fig, ax = plt.subplots(figsize=(6, 4))
        line(ax, (steps, [100 * r for r in rates]), "hit rate")
        ax.set(xlabel="step", ylabel="% of lookups served from RAM (since start)", title="tiered store hit rate (evaluations included)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        save(fig, HIT_RATE_FILE)
    return written
