"""The trainer on several processes: same numbers as one process, sharded checkpoints, the CLI, faults."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from dist_workers import SMALL, compare_runs, train_worker
from tierec.cli import main
from tierec.config import DistConfig, load_config
from tierec.train.sharded_checkpoint import load_any
from tierec.distributed.launch import spawn
from tierec.train.launch import LOST_RANK_STATUS
from tierec.train.trainer import Trainer


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """One process, 12 steps: what every distributed run below must reproduce."""
    run = tmp_path_factory.mktemp("ref")
    Trainer(load_config(None, SMALL), run).fit()
    return run


def test_save_at_4_resume_at_2_and_at_1(tmp_path: Path, reference: Path) -> None:
    # 4 ranks stop after 5 of 12 steps, with a sharded checkpoint
    spawn(train_worker, 4, (SMALL + ["train.max_steps=5"], str(tmp_path / "four"), False))
    ckpt = tmp_path / "four" / "checkpoints" / "step_00000005"
    record = json.loads((ckpt / "meta.json").read_text())["_checkpoint"]
    assert record["world_size"] == 4 and sorted(record["files"]) == sorted(p.name for p in ckpt.iterdir() if p.name not in ("meta.json", "checksums.json"))
    assert {f[:11] for f in record["files"] if f.startswith("rows-")} == {f"rows-{r:05d}-" for r in range(4)}  # every rank's rows
    shutil.copytree(tmp_path / "four", tmp_path / "one")
    # ... resumed on 2 ranks to the end
    spawn(train_worker, 2, (SMALL, str(tmp_path / "four"), True))
    compare_runs(reference, tmp_path / "four")
    # ... and on 1 process (the plain trainer reads the shards)
    Trainer(load_config(None, SMALL), tmp_path / "one", resume=True).fit()
    compare_runs(reference, tmp_path / "one")


def test_single_process_checkpoint_resumes_on_2(tmp_path: Path, reference: Path) -> None:
    Trainer(load_config(None, SMALL + ["train.max_steps=5"]), tmp_path).fit()
    spawn(train_worker, 2, (SMALL, str(tmp_path), True))
    compare_runs(reference, tmp_path)


def test_cli_nproc_with_hot_rows_matches_one_process(tmp_path: Path, capsys) -> None:
    # the first-order rows start from counted rates: each rank sets those it owns, as one process sets them all
    over = SMALL + ["model.name=deepfm", "dist.hot_rows=64", "dist.hot_refresh_every=3", "dist.hot_min_share=0.01",
                    'model.first_order_init="rates"']
    Trainer(load_config(None, over), tmp_path / "ref").fit()
    args = ["train", "--nproc", "2", "--run-dir", str(tmp_path / "two"), "--no-progress"]
    for o in over:
        args += ["--set", o]
    assert main(args) == 0
    compare_runs(tmp_path / "ref", tmp_path / "two")
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["backend"] == "gloo"  # CPU processes: gloo
    # eval and predict on one process from the sharded checkpoint
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "two" / "checkpoints")]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["auc"] == pytest.approx(summary["test_auc"], abs=1e-4)
    scores = tmp_path / "scores.txt"
    assert main(["predict", str(tmp_path / "two" / "checkpoints"), "--split", "test", "--out", str(scores)]) == 0
    lines = scores.read_text().split()
    assert lines[0].startswith('"row","score"') and len(lines) == 1 + 2048  # a header, then a row per test sample


def test_lost_rank_is_named_and_the_job_resumes(tmp_path: Path, reference: Path) -> None:
    over = SMALL + ["train.checkpoint_every=3", "dist.heartbeat_s=0.2", "dist.timeout_s=30"]
    t0 = time.monotonic()
    codes = spawn(train_worker, 2, (over, str(tmp_path), False), env={"TIEREC_TEST_FAIL_AT": "1:8"}, check=False,
                  log_dir=tmp_path)
    elapsed = time.monotonic() - t0
    assert codes == [LOST_RANK_STATUS, 3]  # rank 1 "crashed" with 3 too
    err = (tmp_path / "rank0.log").read_text()
    assert "tierec: error: rank 0: lost rank 1 (no heartbeat)" in err, err[-2000:]
    assert elapsed < 30  # well within dist.timeout_s: not a hang
    _, meta = load_any(tmp_path / "checkpoints")
    assert meta["position"]["step"] == 6  # the last checkpoint before the crash
    spawn(train_worker, 2, (over, str(tmp_path), True))
    compare_runs(reference, tmp_path)
