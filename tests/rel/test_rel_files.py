"""Issue 22 points 1, 2, 4, 6 and 9: no write or read through a link, never over a user's file, integrity that
cannot be switched off by deleting a file, no resume on the defaults, readers never see a checkpoint pruned away."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from rel_helpers import TINY

from tierec.cli import main
from tierec.train import checkpoint as ck
from tierec.train.checkpoint import Checkpoint, load_checkpoint, save_checkpoint

STEPS = ["train.max_steps=4", "train.checkpoint_every=2"]


def _train(run: Path, *extra: str, sets: list[str] = TINY) -> int:
    args = ["train", "--run-dir", str(run), "--no-progress", *extra]
    for o in sets:
        args += ["--set", o]
    return main(args)


def _one_line(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    assert _train(run, sets=TINY + STEPS) == 0
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst, symlinks=True)
    return dst


def _resumed_from_step_2(run: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run), "--resume", "--no-progress", "--set", "train.max_steps=6"]) == 0
    out = capsys.readouterr().out
    assert "step_00000004" in out and "resumed from step 2" in out, out


# ------------------------------------------------------------------------------------ point 1: writes


def test_a_symlinked_plot_pointing_outside_is_left_untouched(trained: Path, tmp_path: Path, capsys) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not a plot")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "throughput.png").symlink_to(outside)
    capsys.readouterr()
    assert _train(fresh, sets=TINY + ["train.max_steps=2"]) == 2  # refused before any work
    _one_line(capsys, "throughput.png", "symbolic link")
    assert not (fresh / "metrics.jsonl").exists() and not (fresh / "checkpoints").exists()
    # a run of tierec's own, its plot replaced by a link afterwards: `report` and `--resume` refuse it
    run = _copy(trained, tmp_path)
    (run / "throughput.png").unlink()
    (run / "throughput.png").symlink_to(outside)
    assert main(["report", str(run)]) == 2
    _one_line(capsys, "throughput.png", "symbolic link")
    assert main(["train", "--run-dir", str(run), "--resume", "--no-progress", "--set", "train.max_steps=6"]) == 2
    _one_line(capsys, "throughput.png", "symbolic link")
    assert outside.read_text() == "not a plot"
    assert (run / "throughput.png").is_symlink()


def test_a_users_own_plot_is_not_overwritten(tmp_path: Path, capsys) -> None:
    run = tmp_path / "mine"
    run.mkdir()
    (run / "loss_auc.png").write_bytes(b"my own picture")
    capsys.readouterr()
    assert _train(run, sets=TINY + ["train.max_steps=2"]) == 2
    _one_line(capsys, "loss_auc.png", "tierec did not write it")
    assert _train(run, sets=TINY + ["train.max_steps=2", "train.plots=false"]) == 0  # what the message allows
    assert (run / "loss_auc.png").read_bytes() == b"my own picture"
    assert main(["report", str(run)]) == 2  # not even on request
    _one_line(capsys, "loss_auc.png")
    assert (run / "loss_auc.png").read_bytes() == b"my own picture"


@pytest.mark.parametrize("name", ["metrics.jsonl", "summary.json", "config.toml"])
def test_run_files_are_never_written_through_a_link(trained: Path, tmp_path: Path, capsys, name: str) -> None:
    run = _copy(trained, tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (run / name).unlink()
    (run / name).symlink_to(outside)
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run), "--resume", "--no-progress", "--set", "train.max_steps=6"]) == 2
    _one_line(capsys, name, "symbolic link")
    assert outside.read_text() == "keep"


def test_the_library_writes_through_the_same_door(tmp_path: Path) -> None:
    """The Trainer without the command line's check: summary.json made a link during training is refused."""
    from tierec.config import load_config
    from tierec.train.runfiles import RunDirError, RunFiles
    from tierec.train.trainer import Trainer

    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    run = tmp_path / "lib"
    run.mkdir()
    (run / "summary.json").symlink_to(outside)
    cfg = load_config(None, TINY + ["train.max_steps=2", "train.progress=false"])
    with pytest.raises(RunDirError, match="summary.json is a symbolic link"):
        Trainer(cfg, run).fit()
    assert outside.read_text() == "keep"
    assert {"config.toml", "metrics.jsonl", "checkpoints"} <= RunFiles(run).own()


def test_tensorboard_dir_may_not_be_a_link(trained: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("tensorboard")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "tb"
    run.mkdir()
    (run / "tensorboard").symlink_to(elsewhere)
    capsys.readouterr()
    assert _train(run, sets=TINY + ["train.max_steps=2", "train.tensorboard=true"]) == 2
    _one_line(capsys, "tensorboard", "symbolic link")
    assert list(elsewhere.iterdir()) == []


def test_rewrites_are_atomic_and_recorded(tmp_path: Path) -> None:
    from tierec.train.runfiles import RunFiles

    files = RunFiles(tmp_path)
    files.write_text("summary.json", "one")
    files.write_text("summary.json", "two")
    assert (tmp_path / "summary.json").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tierec-run", "summary.json"]  # no temporary left
    with files.append("metrics.jsonl") as f:
        f.write("{}\n")
    assert files.own() == {"summary.json", "metrics.jsonl"}


def test_a_run_dir_of_before_recording_keeps_its_files(trained: Path, tmp_path: Path) -> None:
    """A marker written before files were recorded: tierec's names that exist are adopted, once."""
    from tierec.train.runfiles import RunFiles

    run = _copy(trained, tmp_path)
    (run / ".tierec-run").write_text(json.dumps({"tierec_run": 1, "created": 0}) + "\n")
    assert main(["train", "--run-dir", str(run), "--resume", "--no-progress", "--set", "train.max_steps=6"]) == 0
    (run / "store_hit_rate.png").write_bytes(b"mine, made later")
    assert "store_hit_rate.png" not in RunFiles(run).own()


# ------------------------------------------------------------------------------------ point 2: reads


def test_a_symlinked_checkpoint_member_is_refused(trained: Path, tmp_path: Path, capsys) -> None:
    run = _copy(trained, tmp_path)
    step = run / "checkpoints" / "step_00000004"
    member = sorted(step.glob("rows-*.safetensors"))[0]
    outside = tmp_path / "outside.safetensors"
    shutil.move(member, outside)  # the same bytes, now outside the run: the checksum alone would pass
    member.symlink_to(outside)
    capsys.readouterr()
    assert main(["eval", str(step)]) == 2
    _one_line(capsys, member.name, "symbolic link")
    _resumed_from_step_2(run, capsys)


def test_a_symlinked_step_dir_is_refused(trained: Path, tmp_path: Path, capsys) -> None:
    run = _copy(trained, tmp_path)
    step = run / "checkpoints" / "step_00000004"
    outside = tmp_path / "elsewhere" / step.name
    outside.parent.mkdir()
    shutil.move(step, outside)
    step.symlink_to(outside, target_is_directory=True)
    capsys.readouterr()
    assert main(["eval", str(run), "--last"]) == 2
    _one_line(capsys, "step_00000004", "symbolic link")
    assert main(["eval", str(step)]) == 2
    _one_line(capsys, "symbolic link")
    _resumed_from_step_2(run, capsys)
    assert (outside / "meta.json").is_file()  # pruning of the resumed run never touched it


# ------------------------------------------------------------------------------------ point 4: integrity


def _flip_a_rows_file(step: Path) -> Path:
    target = max(step.glob("rows-*.safetensors"), key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[-8] ^= 0x01  # a low bit of a weight: finite, plausible, wrong
    target.write_bytes(bytes(data))
    return target


def test_no_checksums_and_a_flipped_byte_is_refused(trained: Path, tmp_path: Path, capsys) -> None:
    run = _copy(trained, tmp_path)
    step = run / "checkpoints" / "step_00000004"
    (step / "checksums.json").unlink()
    _flip_a_rows_file(step)
    capsys.readouterr()
    assert main(["eval", str(step)]) == 2
    _one_line(capsys, "is corrupt", "checksums.json is missing")
    _resumed_from_step_2(run, capsys)


def test_checksums_missing_one_files_entry_is_refused(trained: Path, tmp_path: Path, capsys) -> None:
    run = _copy(trained, tmp_path)
    step = run / "checkpoints" / "step_00000004"
    target = _flip_a_rows_file(step)
    record = json.loads((step / "checksums.json").read_text())
    del record["files"][target.name]
    (step / "checksums.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["eval", str(step)]) == 2
    _one_line(capsys, "is corrupt", f"does not cover {target.name}")
    _resumed_from_step_2(run, capsys)


# ------------------------------------------------------------------------------------ point 6: resume


def test_resume_before_config_toml_existed_refuses_in_one_line(tmp_path: Path, capsys) -> None:
    run = tmp_path / "crashed"
    run.mkdir()
    (run / ".tierec-run").write_text('{"tierec_run": 1}\n')  # killed after claiming the directory, before config.toml
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / ".tierec.lock").write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run), "--resume", "--set", "store.disk_path=\"/tmp\""]) == 2
    _one_line(capsys, "config.toml", "without --resume")
    assert sorted(p.name for p in run.iterdir()) == [".tierec-run", ".tierec.lock"]  # nothing trained, nothing written
    # what the message says: start it again, with its own config
    assert _train(run, sets=TINY + ["train.max_steps=2"]) == 0


# ------------------------------------------------------------------------------------ point 9: readers


def test_eval_while_pruning_moves_its_pick_picks_the_newest(trained: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """The reader's pick (latest) is pruned between listing and reading, as a training run does."""
    run = _copy(trained, tmp_path)
    ckpts = run / "checkpoints"
    real = ck.find_checkpoint
    pruned: list[Path] = []

    def find_then_prune(path):
        pick = real(path)
        if not pruned and pick.name == "step_00000004":
            shutil.copytree(pick, ckpts / "step_00000006")  # a training run publishes a newer checkpoint ...
            (ckpts / "latest").write_text("step_00000006\n")
            os.replace(pick, ckpts / ".trash-step_00000004-0000abcd")  # ... and prunes this one
            shutil.rmtree(ckpts / ".trash-step_00000004-0000abcd")
            pruned.append(pick)
        return pick

    monkeypatch.setattr(ck, "find_checkpoint", find_then_prune)
    capsys.readouterr()
    assert main(["eval", str(run), "--last"]) == 0, capsys.readouterr().err
    assert pruned and "auc" in capsys.readouterr().out


def test_pruning_skips_a_checkpoint_being_read(tmp_path: Path) -> None:
    w = {"w": torch.ones(3)}
    save_checkpoint(tmp_path, 1, w, {}, keep=1)
    reader = Checkpoint(tmp_path)
    save_checkpoint(tmp_path, 2, w, {}, keep=1)
    assert (tmp_path / "step_00000001").is_dir() and reader.state()["w"].sum() == 3
    reader.close()
    save_checkpoint(tmp_path, 3, w, {}, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_")) == ["step_00000003"]


def test_readers_during_real_saves_never_see_a_broken_checkpoint(tmp_path: Path) -> None:
    rows = [("emb/t", {"ids": torch.arange(64), "weights": torch.randn(64, 8)})] * 6

    def saves() -> None:
        for step in range(1, 80):
            save_checkpoint(tmp_path, step, {"w": torch.full((256,), float(step))}, {"s": step}, keep=1, rows=rows)

    writer = threading.Thread(target=saves)
    save_checkpoint(tmp_path, 0, {"w": torch.zeros(256)}, {"s": 0}, keep=1, rows=rows)
    writer.start()
    loads = 0
    while writer.is_alive():
        tensors, meta = load_checkpoint(tmp_path)  # raised "is incomplete" before readers held their checkpoint
        assert float(tensors["w"][0]) == meta["s"]
        loads += 1
    writer.join()
    assert loads > 0
