"""Issue 17 points 8 and 10 on several processes: one config across ranks; signals to the `--nproc` launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from rel_helpers import TINY

from tierec.cli import main
from tierec.config import load_config
from tierec.train.sharded_checkpoint import load_any
from tierec.distributed.launch import spawn
from tierec.train.trainer import Trainer

CASES = [  # (rank 0's overrides, rank 1's overrides, what every rank must say)
    (["train.progress=false"], ["train.progress=true", "train.threads=1"], "ok"),
    (["data.synthetic.seed=1"], ["data.synthetic.seed=2"], "data.synthetic.seed is 1 on rank 0 but 2 on rank 1"),
    ([], ["embedding.optimizer.lr=0.1"], "embedding.optimizer.lr is 0.05 on rank 0 but 0.1 on rank 1"),
    (["train.batch_size=64"], ["train.batch_size=32", "embedding.dim=8"], "embedding.dim is 16 on rank 0 but 8"),
]


def config_check_worker(ctx, out_dir: str) -> None:
    from tierec.config import ConfigError, load_config
    from tierec.distributed.config_check import check_same_config

    lines = []
    for mine in CASES:
        try:
            check_same_config(load_config(None, mine[ctx.rank]), ctx.rank, ctx.world_size, group=ctx.dense_group)
            lines.append("ok")
        except ConfigError as e:
            lines.append(str(e))
    Path(out_dir, f"rank{ctx.rank}.txt").write_text("\n".join(lines))


def test_ranks_with_different_configs_name_the_first_differing_key(tmp_path: Path) -> None:
    spawn(config_check_worker, 2, (str(tmp_path),), timeout_s=90)
    for rank in (0, 1):
        got = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert len(got) == len(CASES)
        for line, (_, _, want) in zip(got, CASES):
            assert want in line, (rank, line)


# ------------------------------------------------------------------ signals to `tierec train --nproc 2`

REPO = Path(__file__).resolve().parents[2]
JOB = TINY + ["train.batch_size=64", "train.precision=fp32"]  # 32 steps


def _launch(run: Path, *extra: str) -> subprocess.Popen:
    """`tierec train --nproc 2` as a program; returns once both ranks catch signals (rank 0 holds the lock)."""
    cmd = [sys.executable, "-m", "tierec", "train", "--nproc", "2", "--run-dir", str(run), "--no-progress", *extra]
    sets = [] if extra else [x for o in JOB for x in ("--set", o)]
    proc = subprocess.Popen([*cmd, *sets], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run / ".tierec.lock").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "slow"
        time.sleep(0.05)
    return proc


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_nproc_sigterm_saves_exits_143_and_resumes_like_an_uninterrupted_run(tmp_path: Path) -> None:
    run = tmp_path / "job"
    proc = _launch(run)
    try:
        proc.send_signal(signal.SIGTERM)  # to the launcher only, as a scheduler would
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err and err.count("interrupted at step") == 1 and err.count("finishing this step") == 1, err
    stopped = _records(run)[-1]
    assert stopped["kind"] == "interrupted" and 1 <= stopped["step"] < 32  # the step it was in finished, then saved
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{stopped['step']:08d}"
    # ... and `--resume` continues exactly: the run ends as one that was never interrupted
    assert main(["train", "--nproc", "2", "--run-dir", str(run), "--resume", "--no-progress"]) == 0
    Trainer(load_config(None, JOB), tmp_path / "ref").fit()
    got, want = (json.loads((d / "summary.json").read_text()) for d in (run, tmp_path / "ref"))
    assert got["steps"] == want["steps"] == 32
    for k in ("test_auc", "test_logloss", "final_train_loss"):
        assert abs(got[k] - want[k]) < 1e-5, (k, got[k], want[k])
    a, _ = load_any(run / "checkpoints")
    b, _ = load_any(tmp_path / "ref" / "checkpoints")
    dense = sorted(k for k in b if k.startswith("model."))
    assert dense and dense == sorted(k for k in a if k.startswith("model."))
    for k in dense:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=2e-5, msg=k)


FAKE_RANK = """
import os, sys, time
from tierec.train.stopping import GracefulStop
with GracefulStop():
    open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
    time.sleep(120)
"""


def _running(pid: int) -> bool:  # (a zombie is dead, only not reaped yet by its new parent)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def test_a_second_signal_to_the_nproc_launcher_ends_it_and_its_ranks_at_once(tmp_path: Path) -> None:
    """The launcher with stand-ins for two ranks (a real job is above): SIGINT, SIGINT -> 130 at once."""
    ready = tmp_path / "ready"
    ready.mkdir()
    code = ("import sys; from pathlib import Path; from tierec.distributed.local_job import run_local_job; "
            "from tierec.train.stopping import GracefulStop; sys.exit(run_local_job([sys.executable, '-c', sys.argv[1], "
            "sys.argv[2]], 2, Path(sys.argv[3]), signals=GracefulStop.SIGNALS))")
    launcher = subprocess.Popen([sys.executable, "-c", code, FAKE_RANK, str(ready), str(tmp_path)],
                                env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(ready.iterdir())) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        ranks = [int(p.name) for p in ready.iterdir()]
        launcher.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert launcher.poll() is None and all(_running(r) for r in ranks)  # they finish their step
        t0 = time.monotonic()
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=30)
        assert launcher.returncode == 130 and time.monotonic() - t0 < 5, err[-2000:]
        assert "finishing this step" in err and "second SIGINT: stopping now" in err, err
        assert not [r for r in ranks if _running(r)]  # the ranks are gone with it
    finally:
        launcher.kill()
