"""Training with pruning on: metrics and progress, the budget at the end, exact resume, eval from a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tierec.cli import main
from tierec.config import load_config
from tierec.train.checkpoint import load_checkpoint
from tierec.train.trainer import Trainer

from prune_helpers import SMALL


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_pruned_training_reports_and_meets_the_target(tmp_path: Path) -> None:
    lines: list[str] = []
    summary = Trainer(load_config(None, SMALL + ["train.progress=true"]), tmp_path, echo=lines.append).fit()
    prune = [r for r in _records(tmp_path) if r["kind"] == "prune"]
    assert [r["step"] for r in prune] == [4, 8, 12]  # 12 steps: no extra final prune at a pruning step
    last = summary["prune"]
    assert last["allocated_value_bytes"] <= last["target_bytes"] == last["full_value_bytes"] // 4
    assert last["value_bytes"] <= last["allocated_value_bytes"] < last["embedding_bytes"]
    assert last["pruned_chunks"] > 0 and sum(last["dim_hist"].values()) > 0
    assert set(last["dim_hist"]) <= {"0", "2", "4", "6", "8"} or set(last["dim_hist"]) <= {0, 2, 4, 6, 8}
    assert 0.5 < summary["test_auc"] <= 1.0
    assert all("embedding_bytes" in r for r in _records(tmp_path) if r["kind"] == "train")


def test_resume_with_pruning_gives_the_uninterrupted_weights(tmp_path: Path) -> None:
    over = SMALL + ["model.name=deepfm", "embedding.optimizer.kind=adam", "prune.every=3"]
    full = Trainer(load_config(None, over), tmp_path / "full").fit()
    Trainer(load_config(None, over + ["train.max_steps=6"]), tmp_path / "part").fit()  # stops at a pruning step
    resumed = Trainer(load_config(None, over), tmp_path / "part", resume=True).fit()
    a, _ = load_checkpoint(tmp_path / "full" / "checkpoints")
    b, _ = load_checkpoint(tmp_path / "part" / "checkpoints")
    assert a.keys() == b.keys() and any(k.endswith(".dims") for k in a)
    for k in a:
        if not k.startswith("rng."):
            assert torch.equal(a[k], b[k]), k
    assert full["test_auc"] == resumed["test_auc"]


def test_final_prune_and_eval_from_checkpoint(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    args = ["train", "--run-dir", str(run), "--no-progress"]
    for o in SMALL + ["prune.every=5"]:  # 12 steps: pruning at 5 and 10, then once more at the end
        args += ["--set", o]
    assert main(args) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert [r["step"] for r in _records(run) if r["kind"] == "prune"] == [5, 10, 12]
    assert summary["prune"]["allocated_value_bytes"] <= summary["prune"]["target_bytes"]
    capsys.readouterr()
    assert main(["eval", str(run / "checkpoints")]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["auc"] == pytest.approx(summary["test_auc"], abs=1e-9)


@pytest.mark.parametrize("model", ["dcnv2", "widedeep"])
def test_every_model_trains_pruned(tmp_path: Path, model: str) -> None:
    over = SMALL + [f"model.name={model}", "data.synthetic.train_rows=2048", "data.synthetic.test_rows=512", "prune.every=2"]
    summary = Trainer(load_config(None, over), tmp_path).fit()
    assert summary["prune"]["pruned_chunks"] > 0 and 0.0 < summary["test_auc"] <= 1.0
