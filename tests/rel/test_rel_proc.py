"""Issue 22 points 3, 10 and 12: the `--nproc N` launcher and its ranks live and die together; SIGHUP; one-line errors.

Each test runs `tierec train` as a program on a tiny synthetic job and finds the
processes of its run by the run directory in their command line (the ranks'
parent may be the launcher or, before, a torchrun between them).
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

from rel_helpers import TINY

REPO = Path(__file__).resolve().parents[2]
LONG = TINY + ["train.batch_size=64", "train.precision=fp32", "train.epochs=50", "train.checkpoint_every=1000"]
SETS = [x for o in LONG for x in ("--set", o)]


def _env(*prepend: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*prepend, str(REPO)])}


def _hangup_as_on_a_terminal() -> None:
    """In the child: SIGHUP's default action, even when the tests run under nohup (an ignored SIGHUP is
    inherited, and tierec keeps it ignored, as it should for a run started with nohup)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _start(run: Path, *args: str, nproc: int = 2, **popen) -> subprocess.Popen:
    """`tierec train` as a program started from a terminal; returns once the run directory is claimed (rank 0
    holds the lock)."""
    cmd = [sys.executable, "-m", "tierec", "train", "--run-dir", str(run), "--no-progress", *args]
    if nproc > 1:
        cmd[4:4] = ["--nproc", str(nproc)]
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("preexec_fn", _hangup_as_on_a_terminal)
    proc = subprocess.Popen(cmd, env=_env(), stdout=popen.pop("stdout", subprocess.DEVNULL), text=True, **popen)
    deadline = time.monotonic() + 120
    while not (run / ".tierec.lock").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "did not start"
        time.sleep(0.05)
    time.sleep(1.0)  # a few steps in
    return proc


def _stat(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    return stat[stat.rfind(")") + 2]


def _processes_of(run: Path) -> dict[int, str]:
    """Live (not zombie) processes whose command line names ``run``: pid -> their RANK ("" for none)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(run).encode() in cmdline and _stat(int(name)) not in "ZX":
            rank = [e[5:].decode() for e in environ if e.startswith(b"RANK=")]
            found[int(name)] = rank[0] if rank else ""
    return found


def _records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _stop_all(run: Path) -> None:
    for pid in _processes_of(run):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------ point 3: kill -9


def test_kill_9_of_the_nproc_launcher_ends_every_rank_within_2_s(tmp_path: Path) -> None:
    run = tmp_path / "job"
    launcher = _start(run)
    try:
        ranks = [p for p, r in _processes_of(run).items() if r]
        assert len(ranks) == 2
        checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir()) if (run / "checkpoints").exists() else []
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 2.0
        while _processes_of(run) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _processes_of(run)
        time.sleep(1.0)  # nothing of the job may go on: no checkpoint, no record written after the kill
        assert not left, f"still running 2 s after kill -9 of the launcher: {left}"
        after = sorted(p.name for p in (run / "checkpoints").iterdir()) if (run / "checkpoints").exists() else []
        assert after == checkpoints and not [r for r in _records(run) if r["kind"] == "interrupted"]
    finally:
        _stop_all(run)


def test_a_rank_killed_by_sigkill_is_one_line_naming_it_its_signal_and_the_resume(tmp_path: Path) -> None:
    run = tmp_path / "job"
    launcher = _start(run)
    try:
        rank1 = [p for p, r in _processes_of(run).items() if r == "1"]
        assert len(rank1) == 1
        os.kill(rank1[0], signal.SIGKILL)
        _, err = launcher.communicate(timeout=60)
        lines = err.strip().splitlines()
        assert launcher.returncode == 3 and len(lines) == 1, err[-3000:]
        assert "rank 1" in lines[0] and "SIGKILL" in lines[0] and f"--run-dir {run} --resume" in lines[0], err
        assert not _processes_of(run)
    finally:
        launcher.kill()
        _stop_all(run)


# ------------------------------------------------------------------ point 10: SIGHUP


def _hang_up(run: Path, nproc: int) -> None:
    proc = _start(run, *SETS, nproc=nproc)
    try:
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        _stop_all(run)
    assert proc.returncode == 129, err[-3000:]
    assert "Traceback" not in err and err.count("SIGHUP: finishing this step") == 1, err
    stopped = _records(run)[-1]
    assert stopped["kind"] == "interrupted" and stopped["signal"] == signal.SIGHUP
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{stopped['step']:08d}"


def test_sighup_saves_a_checkpoint_and_exits_129(tmp_path: Path) -> None:
    _hang_up(tmp_path / "job", nproc=1)


def test_sighup_to_the_nproc_launcher_saves_a_checkpoint_and_exits_129(tmp_path: Path) -> None:
    _hang_up(tmp_path / "job", nproc=2)


def test_a_closed_terminal_still_gets_its_checkpoint(tmp_path: Path) -> None:
    """stdout and stderr on a pseudo-terminal that is closed before the SIGHUP: writes to it fail (EIO)."""
    run = tmp_path / "job"
    master, slave = pty.openpty()
    try:
        proc = _start(run, *SETS, nproc=1, stdout=slave, stderr=slave)
    finally:
        os.close(slave)
    try:
        os.close(master)  # the terminal goes away
        proc.send_signal(signal.SIGHUP)
        proc.wait(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 129
    stopped = _records(run)[-1]
    assert stopped["kind"] == "interrupted"
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{stopped['step']:08d}"


def test_a_started_ignored_sighup_stays_ignored(tmp_path: Path) -> None:
    """`nohup tierec train ...`: the run goes on after a SIGHUP."""
    run = tmp_path / "job"
    proc = _start(run, *SETS, nproc=1, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
        assert proc.returncode == 143
    finally:
        proc.kill()


# ------------------------------------------------------------------ point 12: errors under --nproc N

SITECUSTOMIZE = """
import os
if "RANK" in os.environ:
    open(os.path.join({marks!r}, "rank" + os.environ["RANK"]), "w").close()
"""


def test_a_config_error_under_nproc_is_one_line_before_any_rank_starts(tmp_path: Path) -> None:
    marks, hook = tmp_path / "marks", tmp_path / "hook"
    marks.mkdir()
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE.format(marks=str(marks)))
    cmd = [sys.executable, "-m", "tierec", "train", "--nproc", "2", "--run-dir", str(tmp_path / "run"),
           "--set", "dist.backend=nccl"]  # several CPU processes: refused by the job's config check
    done = subprocess.run(cmd, env=_env(str(hook)), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("tierec: error: dist.backend"), done.stderr
    assert not list(marks.iterdir())  # no rank was started
    assert not (tmp_path / "run").exists()


def test_the_same_error_on_every_rank_is_printed_once(tmp_path: Path) -> None:
    """A diverged loss (known only once training runs) stops both ranks with the same line: printed once."""
    cmd = [sys.executable, "-m", "tierec", "train", "--nproc", "2", "--run-dir", str(tmp_path / "run"), "--no-progress",
           *SETS, "--set", "train.dense_lr=1e30", "--set", "embedding.optimizer.lr=1e30"]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1 and "the training loss is nan" in done.stderr, done.stderr
