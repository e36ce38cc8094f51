"""Issue 17 points 4-5 and issue 16 point 8: run directories are locked, owned, and resumed with their own config."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rel_helpers import TINY

from tierec.cli import main


def _train(run: Path, *extra: str, sets: list[str] = TINY) -> int:
    args = ["train", "--run-dir", str(run), "--no-progress", *extra]
    for o in sets:
        args += ["--set", o]
    return main(args)


def _finals(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "final"]


def test_reuse_needs_resume_or_overwrite_and_a_bad_config_creates_nothing(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert _train(run, sets=TINY + ["train.bogus=1"]) == 2
    assert not run.exists()
    assert _train(run, sets=TINY + ["train.max_steps=2"]) == 0
    capsys.readouterr()
    assert _train(run, sets=TINY + ["train.max_steps=2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume" in err and "--overwrite" in err
    assert len(_finals(run)) == 1
    (run / "checkpoints" / "notes.txt").write_text("mine")
    assert _train(run, "--overwrite", sets=TINY + ["train.max_steps=3"]) == 0
    assert [f["steps"] for f in _finals(run)] == [3]
    assert (run / "checkpoints" / "notes.txt").read_text() == "mine"


def test_never_writes_over_user_files(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    Path("config.toml").write_text("# my own config\n")
    assert _train(Path("."), sets=TINY + ["train.max_steps=2"]) == 2
    assert "config.toml" in capsys.readouterr().err
    assert _train(Path("."), "--overwrite", sets=TINY + ["train.max_steps=2"]) == 2
    assert Path("config.toml").read_text() == "# my own config\n"
    # user entries named like checkpoint debris, inside a run tierec owns, survive checkpoint saves
    run = tmp_path / "r"
    assert _train(run, sets=TINY + ["train.max_steps=2"]) == 0
    ck = run / "checkpoints"
    for name in ("step_00000001", ".tmp-mine", ".trash-notes"):
        (ck / name).mkdir()
        (ck / name / "data.txt").write_text("user")
    assert _train(run, "--resume", sets=["train.max_steps=6", "train.checkpoint_every=1"]) == 0
    for name in ("step_00000001", ".tmp-mine", ".trash-notes"):
        assert (ck / name / "data.txt").read_text() == "user"
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("step_0000000")) == [
        "step_00000001", "step_00000005", "step_00000006"]


def test_resume_uses_the_runs_own_config(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert _train(run, sets=TINY + ["train.max_steps=3"]) == 0
    config_before = (run / "config.toml").read_text()
    # no other arguments: the run's own data and model, not the 1M-row defaults
    assert main(["train", "--run-dir", str(run), "--resume", "--no-progress", "--set", "train.max_steps=5"]) == 0
    assert [f["steps"] for f in _finals(run)] == [3, 5]
    assert "train_rows = 2048" in (run / "config.toml").read_text()
    capsys.readouterr()
    for key, value in (("embedding.dim", "8"), ("data.source", '"other.txt"'), ("model.name", '"deepfm"')):
        assert main(["train", "--run-dir", str(run), "--resume", "--set", f"{key}={value}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and key in err and "Traceback" not in err
    assert main(["train", "--run-dir", str(run), "--resume", "--config", str(run / "config.toml")]) == 2
    assert (run / "config.toml").read_text() != config_before  # max_steps=5 was recorded ...
    assert len(_finals(run)) == 2  # ... and nothing was written by the refused resumes


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_lock_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert _train(run, sets=TINY + ["train.max_steps=2"]) == 0
    capsys.readouterr()
    holder = _sleeper()
    try:
        (run / ".tierec.lock").write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname()}))
        assert main(["train", "--run-dir", str(run), "--resume", "--set", "train.max_steps=4"]) == 2
        err = capsys.readouterr().err
        assert f"in use by PID {holder.pid}" in err and err.count("\n") == 1
    finally:
        holder.kill()
        holder.wait()
    assert main(["train", "--run-dir", str(run), "--resume", "--no-progress", "--set", "train.max_steps=4"]) == 0
    assert not (run / ".tierec.lock").exists()
    assert [f["steps"] for f in _finals(run)] == [2, 4]


def _pids_mentioning(text: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if text.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_killing_the_nproc_launcher_takes_its_ranks_down(tmp_path: Path) -> None:
    import time

    run = tmp_path / "job"
    cmd = [sys.executable, "-m", "tierec", "train", "--nproc", "2", "--run-dir", str(run), "--no-progress",
           "--set", "data.synthetic.train_rows=10000000", "--set", "train.batch_size=64", "--set", "embedding.dim=4"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    launcher = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (run / ".tierec.lock").exists() and time.monotonic() < deadline:  # the ranks are training
            time.sleep(0.2)
        assert (run / ".tierec.lock").exists()
        assert len(_pids_mentioning(str(run))) >= 3  # torchrun and two ranks
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 20
        while _pids_mentioning(str(run)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _pids_mentioning(str(run)) == []
    finally:
        for pid in _pids_mentioning(str(run)):
            os.kill(pid, 9)
