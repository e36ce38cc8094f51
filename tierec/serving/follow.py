"""``tierec serve --follow RUN_DIR``: what a training run publishes, taken up by the model it serves.

A :class:`RunFollower` watches the run's ``checkpoints/`` (the run the export
was made from) and, asked by the server with the scorer it serves, returns a
new scorer when there is something new, or None:

- **a delta checkpoint** (``train.delta_every``, tierec/train/delta.py) whose
  ``previous`` is the step served: its dense weights go into a fresh module of
  the exported program, its changed rows (re-encoded at the export's
  precision) and deleted ids into each table's overlay
  (tierec/serving/overlay.py); deltas are applied in order, each one's
  checksums verified first;
- **a full checkpoint** newer than the step served (``train.checkpoint_every``,
  the end of a run, an interrupted one): the deltas that follow it are of it,
  so it is exported (``tierec export``, bounded memory) into a private
  directory under the system's temporary directory (``TMPDIR``), loaded
  memory-mapped, and served from there; the one before is deleted.

Nothing is changed in place: the server swaps one reference between requests,
so a request is scored wholly with the state before a publication or wholly
with the one after it. A publication that cannot be taken up (damaged, of
another model) is reported once, in one line, and the server keeps serving
what it has; the next full checkpoint moves it on.

>>> import tempfile, pathlib
>>> from tierec.config import load_config
>>> from tierec.serving.export import export_checkpoint
>>> from tierec.train.trainer import Trainer
>>> run = pathlib.Path(tempfile.mkdtemp())
>>> over = ["data.synthetic.train_rows=1024", "data.synthetic.test_rows=256", "train.batch_size=256", "embedding.dim=4",
...         "train.progress=false", "train.plots=false", "train.delta_every=1", "train.checkpoint_every=2"]
>>> _ = Trainer(load_config(None, over + ["train.max_steps=2"]), run).fit()  # doctest: +ELLIPSIS
step 2: test auc ...
>>> _ = export_checkpoint(run, run / "export")
>>> with RunFollower(run, echo=lambda line: None) as follower:
...     served = follower.start(Scorer.load(run / "export"))
...     _ = Trainer(load_config(None, over + ["train.max_steps=3"]), run, resume=True, echo=lambda s: None).fit()
...     newer = follower.poll(served)
>>> served.describe()["step"], newer.describe()["step"], newer.describe()["checkpoint"]  # the run's end: a full one
(2, 3, 'step_00000003')
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tierec.errors import ConfigError
from tierec.serving.export import ExportConfig, export_checkpoint, model_state, records_chunk
from tierec.serving.manifest import ExportError, ExportManifest
from tierec.serving.overlay import Overlay, PatchedTable
from tierec.serving.rows import RowChunk
from tierec.serving.scorer import Origin, Scorer
from tierec.train.checkpoint import Checkpoint, CheckpointError, delta_dirs, step_dirs
from tierec.train.integrity import validate_tensors
from tierec.train.state import DELETED


def followed_checkpoints(run_dir: Path) -> Path:
    """The checkpoints directory of ``run_dir`` (a run directory, or its checkpoints/ itself)."""
    ckpts = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
    if not ckpts.is_dir():
        raise ConfigError(f"--follow {run_dir}: no such run directory")
    return ckpts


def check_same_run(manifest: ExportManifest, export: str, ckpts: Path, run_dir: Path) -> None:
    """Refuse to follow a run the export was not made from (its deltas would be of other rows and weights)."""
    source = manifest.source_checkpoint
    if source and Path(source).parent.resolve() != ckpts.resolve():
        raise ConfigError(f"--follow {run_dir}: the export {export} was made from {source}, not from a checkpoint of "
                          f"this run; export one of its checkpoints (tierec export {run_dir} --out DIR) and serve that")


class RunFollower:
    """Takes up the publications of the run in ``run_dir``; a context manager (its private exports go on exit)."""

    def __init__(self, run_dir: str | os.PathLike, echo: Callable[[str], None] = print) -> None:
        self.run_dir = Path(run_dir)
        self.checkpoints = followed_checkpoints(self.run_dir)
        self.echo = echo
        self.failed: set[str] = set()  # publications that could not be taken up (reported once)
        self.workspace = Path(tempfile.mkdtemp(prefix="tierec-follow-"))

    def __enter__(self) -> RunFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.workspace, ignore_errors=True)

    def start(self, scorer: Scorer) -> Scorer:
        """``scorer`` (an export of this run, just loaded) with empty overlays over its tables."""
        check_same_run(scorer.manifest, scorer.origin.export, self.checkpoints, self.run_dir)
        return scorer.updated(scorer.program, _patchable(scorer), scorer.origin)

    def poll(self, scorer: Scorer) -> Scorer | None:
        """``scorer`` (from :meth:`start` or an earlier poll) with what the run published since its step, or None."""
        served = scorer
        fulls = step_dirs(self.checkpoints)
        if fulls and _step(fulls[-1]) > served.origin.step and fulls[-1].name not in self.failed:
            served = self._take_full(served, fulls[-1]) or served
        for step, _base, path in delta_dirs(self.checkpoints):
            if step > served.origin.step and path.name not in self.failed and _previous(path) == served.origin.step:
                taken = self._take_delta(served, step, path)
                if taken is None:
                    break
                served = taken
        return None if served is scorer else served

    # ------------------------------------------------------------------ pieces

    def _take_delta(self, served: Scorer, step: int, path: Path) -> Scorer | None:
        t0 = time.perf_counter()
        try:
            with Checkpoint(path) as delta:  # every file's checksum verified first
                new, rows, deleted = apply_delta(served, delta)
                saved_at = delta.meta.get("saved_at")
        except (CheckpointError, ExportError) as e:
            self._failed(path.name, str(e))
            return None
        origin = Origin(export=served.origin.export, export_step=served.origin.export_step, step=step,
                        checkpoint=served.origin.checkpoint, delta=path.name, saved_at=saved_at, applied_at=time.time())  # fmt: skip
        self.echo(f"step {step}: applied {path.name} ({rows:,} rows changed, {deleted:,} deleted) in "
                  f"{time.perf_counter() - t0:.2f} s")  # fmt: skip
        return new.updated(new.program, new.tables, origin)

    def _take_full(self, served: Scorer, path: Path) -> Scorer | None:
        t0 = time.perf_counter()
        out = self.workspace / path.name
        try:
            shutil.rmtree(out, ignore_errors=True)
            manifest = export_checkpoint(path, out, ExportConfig(precision=served.manifest.precision))
            loaded = Scorer.load(out)
            _check_tables(served, loaded, path)
            with open(path / "meta.json", encoding="utf-8") as f:
                saved_at = json.load(f).get("saved_at")
        except (CheckpointError, ExportError, OSError, ValueError) as e:
            self._failed(path.name, str(e))
            shutil.rmtree(out, ignore_errors=True)
            return None
        for old in self.workspace.iterdir():  # the scorer before keeps its tables mapped until it goes
            if old != out:
                shutil.rmtree(old, ignore_errors=True)
        origin = Origin(export=served.origin.export, export_step=served.origin.export_step, step=manifest.step,
                        checkpoint=path.name, saved_at=saved_at, applied_at=time.time())  # fmt: skip
        self.echo(f"step {manifest.step}: took up full checkpoint {path.name} (exported at {served.manifest.precision} "
                  f"in {time.perf_counter() - t0:.1f} s)")  # fmt: skip
        return loaded.updated(loaded.program, _patchable(loaded), origin)

    def _failed(self, name: str, why: str) -> None:
        self.failed.add(name)
        self.echo(f"cannot take up {name}: {' '.join(why.split())[:300]}; still serving what was served")


def apply_delta(scorer: Scorer, delta: Checkpoint) -> tuple[Scorer, int, int]:
    """``scorer`` (with overlays) with the delta checkpoint ``delta`` applied; and its changed and deleted rows."""
    state = delta.state(0)
    problem = validate_tensors(state)
    if problem is not None:
        raise CheckpointError(f"{delta.path}: {problem}")
    program = scorer.program.with_weights(model_state(state, delta.meta))
    rows: dict[str, list[RowChunk]] = {}
    for label, records in delta.rows():
        name = _table(label, scorer, delta.path)
        problem = validate_tensors(records)
        if problem is None and "weights" not in records and "chunked.weights" not in records:
            problem = "no weights"
        if problem is not None:
            raise CheckpointError(f"{delta.path}: rows of {label}: {problem}")
        rows.setdefault(name, []).append(records_chunk(records, scorer.tables[name].dim))
    deleted = {_table(k[len(DELETED) :], scorer, delta.path): v.numpy() for k, v in state.items() if k.startswith(DELETED)}
    tables = dict(scorer.tables)
    for name in rows.keys() | deleted.keys():
        changed = RowChunk.concat(rows[name]) if name in rows else None
        tables[name] = tables[name].patched(changed, deleted.get(name), scorer.manifest.precision)  # type: ignore[attr-defined]
    n_rows = sum(c.size for chunks in rows.values() for c in chunks)
    n_deleted = sum(int(np.asarray(d).size) for d in deleted.values())
    return scorer.updated(program, tables, scorer.origin), n_rows, n_deleted


def _patchable(scorer: Scorer) -> dict[str, PatchedTable]:
    return {name: PatchedTable(t, Overlay.empty(t.dim)) for name, t in scorer.tables.items()}  # type: ignore[arg-type]


def _table(label: str, scorer: Scorer, where: Path) -> str:
    """The served table of a checkpoint label (``emb/C1``, ``wide/C1.wide``)."""
    name = label.split("/", 1)[-1]
    if name not in scorer.tables:
        raise ExportError(f"{where} holds rows of {label!r}, a table the export does not have: not a checkpoint of its run")
    return name


def _check_tables(served: Scorer, loaded: Scorer, path: Path) -> None:
    was = {t.name: t.dim for t in served.manifest.tables}
    now = {t.name: t.dim for t in loaded.manifest.tables}
    if was != now or served.manifest.features != loaded.manifest.features:
        raise ExportError(f"{path} has other tables or features than the export served; serve an export of it instead")


def _step(path: Path) -> int:
    return int(path.name.split("_")[-1])


def _previous(path: Path) -> int | None:
    """The step a delta follows (its meta.json's ``delta.previous``), read without verifying it; None if unreadable."""
    try:
        with open(path / "meta.json", encoding="utf-8") as f:
            return int(json.load(f)["delta"]["previous"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
