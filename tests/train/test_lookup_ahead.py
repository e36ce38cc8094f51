"""store.lookup_ahead: the next batch's lookup in the tiers runs during this step and changes no number."""

from __future__ import annotations

import threading
from itertools import islice
from pathlib import Path

import pytest
import torch

from tierec.config import load_config
from tierec.data import open_source
from tierec.distributed.job import Job
from tierec.train.components import Components
from tierec.train.pipeline import TrainPipeline
from tierec.threads import use_threads
from tierec.train.trainer import Trainer

BASE = ["data.synthetic.train_rows=12288", "data.synthetic.test_rows=2048", "train.batch_size=512",
        "train.progress=false", "train.plots=false", "embedding.dim=16"]


def _tiers(disk: Path, precision: str) -> list[str]:
    # a fast tier of a few batches and a small host tier: every step evicts, writes back and reads from disk
    return ["store.enabled=true", "store.cache_size=256KiB", "store.host_size=24KiB", f"store.disk_path={disk}",
            f"store.cold_precision={precision}", "store.interval=5", "store.prefetch=false"]


def _rows(parts: Components) -> dict[str, torch.Tensor]:
    sd = parts.embeddings.state_dict()
    out = {}
    for k, v in sd.items():
        if ".store." in k or not (k.endswith(".weights") or ".opt." in k):
            continue
        table = k.split(".opt.")[0] if ".opt." in k else k.rsplit(".", 1)[0]
        out[k] = v[torch.argsort(sd[f"{table}.ids"])]
    return out


@pytest.fixture
def two_torch_threads():
    """torch on 2 threads, where the dense step's rounding may depend on its thread count."""
    before = torch.get_num_threads()
    use_threads(2)
    yield
    use_threads(before)


@pytest.mark.parametrize(("precision", "train_threads", "leave", "horizon"),
                         [("fp32", 0, "auto", 0), ("fp32", 0, "on", 0), ("fp32", 0, "auto", 4), ("int8", 0, "auto", 0),
                          ("int8", 0, "off", 0), ("int8", 2, "auto", 0)])
def test_looking_up_ahead_trains_exactly_like_the_sequential_step(
    tmp_path: Path, precision: str, train_threads: int, leave: str, horizon: int, two_torch_threads: None,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = {}
    dense_threads: dict[str, list[int]] = {}  # torch's threads in each dense forward: its rounding depends on them
    for how in ("sequential", "ahead"):
        cfg = load_config(None, BASE + _tiers(tmp_path / how, precision) + [f"train.threads={train_threads}",
                                                                          f"store.leave_core={leave}",
                                                                          f"store.horizon={horizon}"])
        source = open_source(cfg.data, "train", cfg.train.batch_size)
        parts = Components.build(cfg, source.feature_names, source.n_dense)
        group = parts.embeddings.groups[0]
        threads: list[str] = []
        look = group.lookup_ahead

        def counted(keys, tabs, look=look, threads=threads):
            threads.append(threading.current_thread().name)
            return look(keys, tabs)

        group.lookup_ahead = counted
        dense, seen = parts.dense, dense_threads.setdefault(how, [])

        def counted_dense(*args, dense=dense, seen=seen):
            seen.append(torch.get_num_threads())
            return dense(*args)

        monkeypatch.setattr(parts, "dense", counted_dense)
        batches = list(islice(iter(source), 13))
        with TrainPipeline(parts, Job(cfg), cfg) as pipe:
            assert pipe.ahead is not None and pipe.ahead.bring_up
            nexts = [*batches[1:12], None] if how == "ahead" else [None] * 12
            losses = [pipe.step(b, n) for b, n in zip(batches[:12], nexts)]
        stats = group.stats()
        runs[how] = (losses, _rows(parts), stats)
        if how == "ahead":  # it ran, on the pipeline's thread, and did move rows
            assert len(threads) == 11 and all(t.startswith("tierec-ahead") for t in threads)
            assert sum(s["disk_read_rows"] for s in stats.values()) > 0
            assert sum(s["evicted"] for s in stats.values()) > 0
        group.close()
    # train.threads = 0 with compact rows: the step leaves the lookup ahead a core, in every step, whether it runs
    # one or not, as with a horizon; fp32 rows without one keep both (the numbers of the same run in memory) unless
    # store.leave_core is on
    leaves = train_threads == 0 and (leave == "on" or (leave == "auto" and (precision != "fp32" or horizon > 0)))
    assert dense_threads["ahead"] == dense_threads["sequential"] == [1 if leaves else 2] * 12
    assert torch.get_num_threads() == 2  # given back after each step
    (la, ra, sa), (lb, rb, sb) = runs["sequential"], runs["ahead"]
    assert la == lb
    assert ra.keys() == rb.keys() and all(torch.equal(ra[k], rb[k]) for k in ra)
    if precision != "fp32":  # rounded rows: the same rows move (fp32 rows may move otherwise, with the same values)
        assert sa == sb


def test_a_lookup_the_tiers_left_to_the_forward_keeps_the_next_one_waiting(tmp_path: Path, two_torch_threads: None) -> None:
    """Where the loop leaves the tiers a core, the next batch's lookup starts before this batch's forward only
    when this batch's lookup ran ahead; where the tiers left it to the forward (here every third one), the next
    waits for it (int8 rows: lookups in another order round other rows)."""
    import time

    runs = {}
    for how in ("sequential", "ahead"):
        cfg = load_config(None, BASE + _tiers(tmp_path / how, "int8") + ["store.leave_core=on", "store.interval=1000"])
        source = open_source(cfg.data, "train", cfg.train.batch_size)
        parts = Components.build(cfg, source.feature_names, source.n_dense)
        group = parts.embeddings.groups[0]
        look, lookup, calls = group.lookup_ahead, group.lookup, []

        def refusing(keys, tabs, known=None, look=look, calls=calls):
            calls.append(len(calls))
            if len(calls) % 3 == 0:
                return None  # as the tiers do where a hotness pass is due, or two batches might not fit
            return look(keys, tabs) if known is None else look(keys, tabs, known=known)

        def slow(keys, tabs, insert, known=None, lookup=lookup):  # the forward's own lookup: late
            if threading.current_thread() is threading.main_thread():
                time.sleep(0.05)
            return lookup(keys, tabs, insert, known)

        group.lookup_ahead, group.lookup = refusing, slow
        batches = list(islice(iter(source), 13))
        with TrainPipeline(parts, Job(cfg), cfg) as pipe:
            assert pipe.step_threads == 1
            nexts = [*batches[1:12], None] if how == "ahead" else [None] * 12
            losses = [pipe.step(b, n) for b, n in zip(batches[:12], nexts)]
        runs[how] = (losses, _rows(parts))
        if how == "ahead":
            assert len(calls) == 11
        group.close()
    (la, ra), (lb, rb) = runs["sequential"], runs["ahead"]
    assert la == lb
    assert ra.keys() == rb.keys() and all(torch.equal(ra[k], rb[k]) for k in ra)


def test_a_run_with_checkpoints_resumes_exactly_with_lookups_ahead(tmp_path: Path) -> None:
    """Checkpoints, evaluations and the end are boundaries the pipeline does not look across."""
    import shutil

    over = BASE + _tiers(tmp_path / "rows", "int8") + ["train.checkpoint_every=5", "train.eval_every=4",
                                                       "data.validation_rows=1024"]
    full = Trainer(load_config(None, over), tmp_path / "full", echo=lambda _: None).fit()
    assert full["steps"] == 24
    shutil.copytree(tmp_path / "full", tmp_path / "part")
    ckpts = tmp_path / "part" / "checkpoints"
    kept = sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step_"))
    for name in kept[1:]:  # resume from the earliest kept checkpoint
        shutil.rmtree(ckpts / name)
    (ckpts / "latest").unlink()
    resumed = Trainer(load_config(None, over), tmp_path / "part", resume=True, echo=lambda _: None).fit()
    assert resumed["steps"] == 24
    assert resumed["test_auc"] == full["test_auc"] and resumed["final_train_loss"] == full["final_train_loss"]
    plain = Trainer(load_config(None, over + ["store.lookup_ahead=false"]), tmp_path / "plain", echo=lambda _: None).fit()
    assert abs(plain["test_auc"] - full["test_auc"]) < 0.01  # int8 rows: one batch pinned, not two, moves rows


def test_a_fast_tier_of_one_batch(tmp_path: Path) -> None:
    """fp32 rows: the lookup waits for the step instead (same numbers); int8 rows: a clear error."""
    from tierec.store.group import CacheCapacityError

    small = ["store.cache_size=128KiB"]
    ahead = Trainer(load_config(None, BASE + _tiers(tmp_path / "a", "fp32") + small), tmp_path / "run", echo=lambda _: None).fit()
    off = ["store.lookup_ahead=false"]
    seq = Trainer(load_config(None, BASE + _tiers(tmp_path / "b", "fp32") + small + off), tmp_path / "run2", echo=lambda _: None).fit()
    assert ahead["test_auc"] == seq["test_auc"] and ahead["final_train_loss"] == seq["final_train_loss"]
    lines: list[str] = []
    Trainer(load_config(None, BASE + _tiers(tmp_path / "d", "fp32")), tmp_path / "run4", echo=lines.append).fit()
    assert any("store.lookup_ahead" in line for line in lines)  # the run says it looks up ahead
    with pytest.raises(CacheCapacityError, match="store.lookup_ahead = false"):
        Trainer(load_config(None, BASE + _tiers(tmp_path / "c", "int8") + small), tmp_path / "run3", echo=lambda _: None).fit()


def test_the_stage_on_a_thread_of_its_own_trains_as_on_the_steps_thread(
    tmp_path: Path, two_torch_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """train.threads = 0 with a lookup ahead: the step leaves the store a core, and the store's stage (reads
    ahead, the horizon's ids) runs there; the same run on the step's thread (train.threads = 1: as many dense
    threads) gives the same numbers, with compact rows, whose values depend on where rows were."""
    from tierec.store.pipeline import StorePipeline

    stage_threads: set[str] = set()
    stage = StorePipeline.stage

    def named(self, window, first, seen=None):
        stage_threads.add(threading.current_thread().name)
        return stage(self, window, first, seen)

    monkeypatch.setattr(StorePipeline, "stage", named)
    tiers = ["store.prefetch=true", "store.horizon=6", "train.epochs=2", "train.checkpoint_every=7"]
    runs = {}
    for threads in (0, 1):
        over = BASE + _tiers(tmp_path / f"rows{threads}", "int8") + tiers + [f"train.threads={threads}"]
        stage_threads.clear()
        runs[threads] = Trainer(load_config(None, over), tmp_path / f"run{threads}", echo=lambda _: None).fit()
        assert stage_threads == ({"tierec-stage"} if threads == 0 else {threading.current_thread().name})
        use_threads(2)  # train.threads = 1 set the process's count
    a, b = runs[0], runs[1]
    assert a["store"]["disk_read_rows"] > 0 and a["store"]["pipeline"]["staged_rows"] > 0
    assert a["test_auc"] == b["test_auc"] and a["final_train_loss"] == b["final_train_loss"]
