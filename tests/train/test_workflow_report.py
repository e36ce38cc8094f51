"""Issue 16 point 10: pictures of a run (PNG plots at the end of train and with `tierec report`), TensorBoard."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tierec.cli import main

TINY = ["data.synthetic.train_rows=4096", "data.synthetic.test_rows=512", "data.synthetic.cardinality_scale=0.001",
        "train.batch_size=256", "embedding.dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]", "train.eval_every=4"]


def _sets(items: list[str]) -> list[str]:
    return [x for o in items for x in ("--set", o)]


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_train_draws_the_plots_and_report_redraws_them(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    tiered = ["store.enabled=true", "store.memory_budget=64KiB", f"store.disk_path={json.dumps(str(tmp_path / 'disk'))}"]
    assert main(["train", "--run-dir", str(run), "--no-progress", *_sets(TINY + tiered)]) == 0
    out = capsys.readouterr().out
    names = ["loss_auc.png", "throughput.png", "embedding.png", "store_hit_rate.png"]
    assert f"plots           {', '.join(names)}" in out
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 17))  # 16 steps: a record each (short runs: up to 100 records)
    assert train[-1]["embedding_rows"] > train[0]["embedding_rows"] > 0
    assert [r["step"] for r in records if r["kind"] == "eval" and r["split"] == "validation"][:3] == [4, 8, 12]
    sizes = {}
    for n in names:
        sizes[n] = _png_size(run / n)
        (run / n).unlink()
    assert sizes["loss_auc.png"] == (1000, 400) and sizes["throughput.png"] == (600, 400)
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().out.split() == [str(run / n) for n in names]
    assert all((run / n).stat().st_size > 10_000 for n in names)


def test_report_without_a_store_and_on_a_non_run(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), "--no-progress", *_sets(TINY + ["train.plots=false"])]) == 0
    assert not list(run.glob("*.png"))
    assert main(["report", str(run)]) == 0
    assert sorted(p.name for p in run.glob("*.png")) == ["embedding.png", "loss_auc.png", "throughput.png"]
    capsys.readouterr()
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metrics.jsonl: no such file" in err


def test_tensorboard_event_files(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), "--no-progress", *_sets(TINY + ["train.tensorboard=true", "train.plots=false"])]) == 0
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/samples_per_s", "train/embedding_rows", "validation/auc", "test/auc"} <= tags
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 17))
    final = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in line][-1]
    assert acc.Scalars("test/auc")[-1].value == pytest.approx(final["auc"], rel=1e-6)


def test_missing_tensorboard_is_one_line_and_nothing_is_written(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed: find_spec raises / import fails
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    run = tmp_path / "run"
    code = main(["train", "--run-dir", str(run), "--no-progress", *_sets(TINY + ["train.tensorboard=true"])])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "train.tensorboard = true needs the tensorboard package: pip install 'tierec[tensorboard]'" in err
    assert not run.exists()
