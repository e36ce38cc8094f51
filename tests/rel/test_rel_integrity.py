"""Issue 17 points 6 and 10: corrupt checkpoints are caught (and skipped on resume), NaN stops, signals save."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from rel_helpers import TINY

from tierec.cli import main
from tierec.train.integrity import write_checksums

REPO = Path(__file__).resolve().parents[2]


def _train(run: Path, *extra: str, sets: list[str] = TINY) -> int:
    args = ["train", "--run-dir", str(run), "--no-progress", *extra]
    for o in sets:
        args += ["--set", o]
    return main(args)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    assert _train(run, sets=TINY + ["train.max_steps=4", "train.checkpoint_every=2"]) == 0
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    import shutil

    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


@pytest.mark.parametrize("damage", ["flip", "truncate", "zero-pad"])
def test_resume_skips_a_damaged_newest_checkpoint(trained: Path, tmp_path: Path, capsys, damage: str) -> None:
    run = _copy(trained, tmp_path)
    f = run / "checkpoints" / "step_00000004" / "tensors.safetensors"
    data = bytearray(f.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) - 100]
    else:
        data = data + bytes(4096)
    f.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["eval", str(run / "checkpoints" / "step_00000004")]) == 2
    err = capsys.readouterr().err
    assert "is corrupt" in err and "tensors.safetensors" in err and err.count("\n") == 1
    assert main(["train", "--run-dir", str(run), "--resume", "--no-progress", "--set", "train.max_steps=6"]) == 0
    out = capsys.readouterr().out
    assert "step_00000004 is corrupt" in out and "resumed from step 2" in out
    finals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"final"' in x]
    assert finals[-1]["steps"] == 6


@pytest.mark.parametrize("bad", ["nan-weight", "inf-weight", "duplicate-id", "negative-id"])
def test_invalid_values_in_a_checkpoint_are_refused(trained: Path, tmp_path: Path, capsys, bad: str) -> None:
    run = _copy(trained, tmp_path)
    ckpt = run / "checkpoints" / "step_00000004"
    target = next(p for p in sorted(ckpt.glob("rows-*.safetensors")) if load_file(p)["ids"].numel() >= 2)
    with safe_open(target, "pt") as f:
        header = f.metadata()
    tensors = load_file(target)
    if bad == "nan-weight":
        tensors["weights"][1, 0] = float("nan")
    elif bad == "inf-weight":
        target = ckpt / "tensors.safetensors"
        header, tensors = None, load_file(target)
        next(v for k, v in tensors.items() if k.startswith("model.") and v.is_floating_point()).view(-1)[0] = float("inf")
    elif bad == "duplicate-id":
        tensors["ids"][1] = tensors["ids"][0]
    else:
        tensors["ids"][0] = -5
    save_file(tensors, target, metadata=header)
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["_checkpoint"]["files"][target.name] = target.stat().st_size
    meta["_checkpoint"]["tensors_bytes"] = (ckpt / "tensors.safetensors").stat().st_size
    (ckpt / "meta.json").write_text(json.dumps(meta))
    (ckpt / "checksums.json").unlink()
    write_checksums(ckpt)  # a consistent checkpoint with bad values: only the value checks can catch it
    capsys.readouterr()
    assert main(["eval", str(ckpt)]) == 2
    err = capsys.readouterr().err
    word = {"nan-weight": "NaN", "inf-weight": "NaN or infinite", "duplicate-id": "duplicate", "negative-id": "negative"}[bad]
    assert word in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_checkpoint_of_another_model_is_one_line(trained: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["eval", str(trained / "checkpoints"), "--set", "embedding.dim=8"]) == 2
    err = capsys.readouterr().err
    assert "does not fit this model" in err and err.count("\n") == 1


def test_nan_loss_stops_the_run_and_bad_rates_are_config_errors(tmp_path: Path, capsys) -> None:
    for rate in ("embedding.optimizer.lr=nan", "embedding.optimizer.lr=inf", "train.dense_lr=-1", "train.dense_lr=0"):
        assert _train(tmp_path / "r0", sets=TINY + [rate]) == 2
        err = capsys.readouterr().err
        assert rate.split("=")[0] in err and err.count("\n") == 1
    run = tmp_path / "r"
    huge = ["train.dense_optimizer=\"sgd\"", "train.dense_lr=1e30", "embedding.optimizer.kind=\"sgd\"",
            "embedding.optimizer.lr=1e30", "train.checkpoint_every=1", "train.max_steps=8"]
    assert _train(run, sets=TINY + huge) == 2
    err = capsys.readouterr().err
    assert "the training loss is nan" in err or "the training loss is inf" in err
    assert err.count("\n") == 1 and "train.nan_policy" in err
    assert not (run / "summary.json").exists()  # no summary of a diverged model
    _train(tmp_path / "r2", sets=TINY + huge + ["train.nan_policy=\"continue\""])  # trains on to the end ...
    assert "step 8: test auc nan" in capsys.readouterr().out  # ... where the undefined AUC is an error of its own


def _start(run: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tierec", "train", "--run-dir", str(run), "--no-progress",
           "--set", "data.synthetic.train_rows=4000000", "--set", "data.synthetic.cardinality_scale=0.001",
           "--set", "train.batch_size=128", "--set", "embedding.dim=4"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(run: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if (run / ".tierec.lock").exists() and (run / "config.toml").exists():
            time.sleep(3.0)  # data and model built, some steps done
            return
        time.sleep(0.1)
    raise AssertionError("training did not start")


@pytest.mark.parametrize("sig,status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_finishes_the_step_and_saves(tmp_path: Path, sig: int, status: int) -> None:
    run = tmp_path / "run"
    proc = _start(run)
    try:
        _wait_for_steps(run, proc)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == status, err[-2000:]
    assert "Traceback" not in err and "checkpoint saved" in err
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert int(latest.removeprefix("step_")) > 0
    assert not (run / ".tierec.lock").exists()


def test_a_second_signal_exits_at_once() -> None:
    code = ("import os, signal, time\nfrom tierec.train.stopping import GracefulStop\n"
            "with GracefulStop():\n    os.kill(os.getpid(), signal.SIGINT)\n    os.kill(os.getpid(), signal.SIGINT)\n"
            "    time.sleep(30)\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 130 and "stopping now" in r.stderr and time.monotonic() - t0 < 25


def _as_sharded_format(step_dir: Path) -> None:
    """Rewrite a checkpoint in the previous sharded format (manifest.json, one shard) that tierec still reads."""
    from tierec.train.checkpoint import load_checkpoint

    tensors, meta = load_checkpoint(step_dir)
    for p in step_dir.iterdir():
        p.unlink()
    shard = step_dir / "shard-00000-of-00001.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, shard)
    meta = {k: v for k, v in meta.items() if k != "_checkpoint"}
    meta["_sharded"] = {"format": 1, "world_size": 1, "shards": [{"file": shard.name, "bytes": shard.stat().st_size}]}
    (step_dir / "manifest.json").write_text(json.dumps(meta))


def test_resume_skips_a_damaged_checkpoint_of_the_previous_sharded_format(trained: Path, tmp_path: Path, capsys) -> None:
    run = _copy(trained, tmp_path)
    for step in ("step_00000002", "step_00000004"):
        _as_sharded_format(run / "checkpoints" / step)
    shard = run / "checkpoints" / "step_00000004" / "shard-00000-of-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated by a crash
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run), "--resume", "--no-progress", "--set", "train.max_steps=6"]) == 0
    out = capsys.readouterr().out
    assert "step_00000004 is corrupt" in out and "resumed from step 2" in out, out
