"""`tierec train` on a 2x2 mesh (dist.group_size = 2 of 4 ranks) against one process; one-replica checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dist_workers import SMALL, compare_runs, train_worker
from tierec.cli import main
from tierec.config import load_config
from tierec.distributed.launch import spawn
from tierec.train.trainer import Trainer

MESH = ["dist.group_size=2"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """One process, 12 steps: what the 2x2 runs in gradients mode, uncompressed, must reproduce."""
    run = tmp_path_factory.mktemp("ref")
    Trainer(load_config(None, SMALL), run).fit()
    return run


def _records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def test_cli_nproc_4_as_2x2_equals_one_process(tmp_path: Path, reference: Path) -> None:
    args = ["train", "--nproc", "4", "--run-dir", str(tmp_path), "--no-progress"]
    for o in SMALL + MESH + ["train.eval_every=6"]:
        args += ["--set", o]
    assert main(args) == 0
    compare_runs(reference, tmp_path)  # rows and optimizer state, dense weights, test AUC / logloss, loss
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["world_size"], summary["replicas"]) == (4, 2)
    ref = json.loads((reference / "summary.json").read_text())
    assert summary["embedding_rows"] == ref["embedding_rows"]  # one replica holds every row once
    ckpt = json.loads((tmp_path / "checkpoints" / "step_00000012" / "meta.json").read_text())
    assert ckpt["_checkpoint"]["world_size"] == 2 and ckpt["mesh"] == {"group_size": 2, "replicas": 2}
    # bytes per step inside the group and across groups, in metrics.jsonl
    train = _records(tmp_path, "train")
    assert train and all(r["bytes_inside_per_step"] > 0 and r["bytes_across_per_step"] > 0 for r in train)
    assert [(r["split"], r["step"]) for r in _records(tmp_path, "eval")] == [("validation", 6), ("validation", 12), ("test", 12)]


def test_2x2_checkpoint_resumes_on_1_and_on_2x2(tmp_path: Path, reference: Path) -> None:
    spawn(train_worker, 4, (SMALL + MESH + ["train.max_steps=5"], str(tmp_path / "mesh"), False), timeout_s=300)
    ckpt = tmp_path / "mesh" / "checkpoints" / "step_00000005"
    record = json.loads((ckpt / "meta.json").read_text())["_checkpoint"]
    assert record["world_size"] == 2  # one replica: group 0's two shards
    assert {f[:11] for f in record["files"] if f.startswith("rows-")} == {"rows-00000-", "rows-00001-"}
    shutil.copytree(tmp_path / "mesh", tmp_path / "one")
    spawn(train_worker, 4, (SMALL + MESH, str(tmp_path / "mesh"), True), timeout_s=300)  # 2x2 -> 2x2
    compare_runs(reference, tmp_path / "mesh")
    Trainer(load_config(None, SMALL + MESH), tmp_path / "one", resume=True).fit()  # 2x2 -> 1 process
    compare_runs(reference, tmp_path / "one")
