"""TrainPipeline: every stage that runs ahead of the step changes no number, and breaking out stops them all."""

from __future__ import annotations

import dataclasses
import threading
from itertools import islice
from pathlib import Path

import pytest

from tierec.config import load_config
from tierec.data import open_source
from tierec.distributed import DistContext, ShardedEmbeddingCollection
from tierec.distributed.job import Job
from tierec.train.components import Components
from tierec.train.pipeline import TrainPipeline
from tierec.train.trainer import Trainer

BASE = ["data.synthetic.train_rows=12288", "data.synthetic.test_rows=2048", "train.batch_size=1024",
        "train.progress=false", "train.plots=false", "embedding.dim=8"]
TIERS = ["store.enabled=true", "store.cache_size=256KiB", "store.host_size=256KiB"]


def _fit(tmp_path: Path, name: str, extra: list[str]) -> dict:
    return Trainer(load_config(None, BASE + extra), tmp_path / name, echo=lambda _: None).fit()


@pytest.mark.parametrize("sequential, ahead", [
    (["train.look_ahead=false"], ["train.look_ahead=true"]),  # stage 2
    (TIERS, [*TIERS, "store.prefetch=true", "store.prefetch_depth=3"]),  # stage 3 of the tiers
])
def test_a_stage_ahead_changes_no_number(tmp_path: Path, sequential: list[str], ahead: list[str]) -> None:
    a = _fit(tmp_path, "sequential", sequential + [f"store.disk_path={tmp_path / 'd1'}"] * ("store.enabled=true" in sequential))
    b = _fit(tmp_path, "ahead", ahead + [f"store.disk_path={tmp_path / 'd2'}"] * ("store.enabled=true" in ahead))
    assert a["steps"] == b["steps"] == 12
    assert a["test_auc"] == b["test_auc"] and a["final_train_loss"] == b["final_train_loss"]
    assert a["embedding_rows"] == b["embedding_rows"]


def test_step_is_the_loop_step(tmp_path: Path) -> None:
    """Calling step() on held batches (as benchmarks do) trains exactly as run() does."""
    cfg = load_config(None, BASE + ["train.look_ahead=true"])
    source = open_source(cfg.data, "train", cfg.train.batch_size)
    losses = {}
    for how in ("run", "step"):
        parts = Components.build(cfg, source.feature_names, source.n_dense)
        with TrainPipeline(parts, Job(cfg), cfg) as pipe:
            if how == "run":
                losses[how] = [s.loss for s in islice(pipe.run(source), 6)]
            else:
                batches = list(islice(iter(source), 7))
                losses[how] = [pipe.step(b, n) for b, n in zip(batches[:6], batches[1:])]
    assert losses["run"] == losses["step"]


def test_breaking_out_stops_every_stage(tmp_path: Path) -> None:
    cfg = load_config(None, BASE + TIERS + ["store.prefetch=true", f"store.disk_path={tmp_path}", "train.look_ahead=true"])
    source = open_source(cfg.data, "train", cfg.train.batch_size)
    parts = Components.build(cfg, source.feature_names, source.n_dense)
    before = {t.name for t in threading.enumerate()}
    with TrainPipeline(parts, Job(cfg), cfg) as pipe:
        steps = pipe.run(source)
        for i, _ in enumerate(steps):
            if i == 2:
                break
        steps.close()
    alive = [t.name for t in threading.enumerate() if t.name.startswith("tierec") and t.name not in before and t.is_alive()]
    assert alive == []
    group = parts.embeddings.groups[0]
    assert pipe.store.pipeline_stats()["batches"] >= 3  # the store's stage did run ahead
    assert group.staging.held_rows == 0  # and holds no record for batches that will not come


class _Recording(ShardedEmbeddingCollection):
    """A sharded collection (over one process) that keeps every handle its ``prepare`` returns."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.handles = []

    def prepare(self, sparse):
        self.handles.append(super().prepare(sparse))
        return self.handles[-1]


class _AsIfSeveral:
    """A one-process Job that the pipeline takes for a job of several (its stage 3 prepares each next batch)."""

    distributed = True

    def __init__(self, job: Job) -> None:
        self.job = job

    def __getattr__(self, name: str):
        return getattr(self.job, name)


def test_each_step_gets_the_exchange_prepared_for_it() -> None:
    """Stage 3 of several processes: the handle the sharded collection's ``prepare`` returned for batch t + 1 is
    used by batch t + 1's forward (a forward refuses any other), the one no step used is waited out at close, and
    the losses are those of the sequential step (dist.overlap off: nothing prepared)."""
    losses, states = {}, {}
    for overlap in (False, True):
        cfg = load_config(None, BASE + [f"dist.overlap={str(overlap).lower()}"])
        source = open_source(cfg.data, "train", cfg.train.batch_size)
        batches = list(islice(iter(source), 5))
        parts = Components.build(cfg, source.feature_names, source.n_dense)
        coll = _Recording(parts.embeddings, DistContext.single(), cfg.dist)
        with TrainPipeline(dataclasses.replace(parts, embeddings=coll), _AsIfSeveral(Job(cfg)), cfg) as pipe:
            losses[overlap] = [pipe.step(b, n) for b, n in zip(batches[:4], batches[1:])]  # batch 4: prepared only
            during = [h.state for h in coll.handles]
        states[overlap] = (during, [h.state for h in coll.handles])
    assert losses[True] == losses[False]
    assert states[False] == ([], [])
    assert states[True] == (["used"] * 3 + ["posted"], ["used"] * 3 + ["waited out"])
