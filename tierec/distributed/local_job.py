"""``tierec train --nproc N``: the launcher starts N local ranks itself, watches them, and takes them down with it.

``run_local_job`` starts each rank as ``python -u -m tierec <argv without --nproc>``
with the environment torchrun would give it (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); like
torchrun's agent, the launcher hosts the job's rendezvous store, so that a rank
that ends does not take the store (and the others' heartbeats) with it. Then:

- every rank gets ``PR_SET_PDEATHSIG`` (SIGKILL) toward the launcher before it
  runs any of its own code: ``kill -9`` of the launcher ends every rank at once;
- the ranks run in a session of their own, so a terminal's Ctrl-C or hang-up
  reaches only the launcher, which forwards the first stop signal to them
  (they finish the step, save and exit 0) and kills them on a second one;
- the launcher polls its ranks every 50 ms: when one ends with an error or a
  signal, the others are killed at once (no checkpoint can be written without
  it) and one line names the rank, how it ended and the command that resumes;
- a rank's one-line errors go through a pipe (``report_error``) instead of to
  stderr: the launcher prints each distinct line once.

>>> rank_command(["train", "--nproc", "2", "--run-dir", "r"])[1:]
['-u', '-m', 'tierec', 'train', '--run-dir', 'r']
>>> RankEnd(rank=1, status=-9).describe()
'rank 1 was killed by SIGKILL'
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierec.distributed.context import STORE_ENV
from tierec.distributed.launch import parent_death_hook

LAUNCHER_ENV = "TIEREC_LAUNCHER_PID"  # set for the ranks of `--nproc N`: an interrupted rank then exits 0
ERROR_FD_ENV = "TIEREC_ERROR_FD"  # the write end of the launcher's pipe for the ranks' one-line errors
LOST_RANK_STATUS = 3  # the exit status of a job (or of a surviving rank) that lost a rank
POLL_S = 0.05


def strip_nproc(argv: list[str]) -> list[str]:
    """``argv`` without ``--nproc N`` / ``--nproc=N``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        out.append(a)
    return out


def rank_command(argv: list[str]) -> list[str]:
    """The command line of one rank of ``tierec <argv>`` (``--nproc`` removed)."""
    return [sys.executable, "-u", "-m", "tierec", *strip_nproc(argv)]


def report_error(line: str) -> None:
    """A rank's (or a lone process's) one-line error: to the launcher when there is one, else to stderr."""
    fd = os.environ.get(ERROR_FD_ENV, "")
    if fd.isdigit():
        try:
            os.write(int(fd), (line.replace("\n", " ") + "\n").encode())
            return
        except OSError:
            pass
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RankEnd:
    """How one rank ended: ``status`` as Popen gives it (negative: killed by that signal)."""

    rank: int
    status: int

    @property
    def signal(self) -> int | None:
        return -self.status if self.status < 0 else None

    def describe(self) -> str:
        if self.signal is None:
            return f"rank {self.rank} exited with status {self.status}"
        try:
            name = signal.Signals(self.signal).name
        except ValueError:
            name = f"signal {self.signal}"
        return f"rank {self.rank} was killed by {name}"


@dataclass
class LocalJob:
    """The rank processes of one ``--nproc N`` run, children of this (the launcher) process."""

    procs: list[subprocess.Popen]
    errors_fd: int  # read end of the ranks' error pipe (non-blocking)
    store: Any  # the job's rendezvous store (a TCPStore server), alive as long as this object
    _pending: bytes = b""
    lines: list[str] = field(default_factory=list)  # the distinct error lines ranks reported, in order

    @staticmethod
    def start(command: list[str], nproc: int) -> LocalJob:
        from torch.distributed import TCPStore

        store = TCPStore("127.0.0.1", 0, nproc, is_master=True, wait_for_workers=False)
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        base = {**os.environ, LAUNCHER_ENV: str(os.getpid()), ERROR_FD_ENV: str(write_fd), STORE_ENV: "launcher"}
        base.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets
        port = str(store.port)
        procs = []
        try:
            for r in range(nproc):
                rank_env = {**base, "RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r),
                            "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
                procs.append(subprocess.Popen(command, env=rank_env, pass_fds=(write_fd,), start_new_session=True,
                                              preexec_fn=parent_death_hook(signal.SIGKILL)))
        except BaseException:
            for p in procs:
                p.kill()
                p.wait()
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        return LocalJob(procs, read_fd, store)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every rank still running."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(sig)

    def kill(self, wait_s: float = 2.0) -> None:
        """SIGKILL every rank still running and reap it (up to ``wait_s``): gone, not zombies, when we return."""
        self.signal(signal.SIGKILL)
        deadline = time.monotonic() + wait_s
        for p in self.procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass

    def wait(self) -> RankEnd | None:
        """Until every rank exited 0 (None) or one failed: that one (a signal death before an error exit)."""
        while True:
            self._read_errors()
            codes = [p.poll() for p in self.procs]
            failed = [RankEnd(r, c) for r, c in enumerate(codes) if c]
            if failed:
                return min(failed, key=lambda e: (e.signal is None, e.rank))
            if all(c == 0 for c in codes):
                return None
            time.sleep(POLL_S)

    def close(self) -> None:
        self._read_errors()
        if self._pending:
            self._add(self._pending.decode(errors="replace"))
            self._pending = b""
        os.close(self.errors_fd)

    def _read_errors(self) -> None:
        while True:
            try:
                chunk = os.read(self.errors_fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                return
            *whole, self._pending = (self._pending + chunk).split(b"\n")
            for line in whole:
                self._add(line.decode(errors="replace"))

    def _add(self, line: str) -> None:
        if line and line not in self.lines:
            self.lines.append(line)


def run_local_job(command: list[str], nproc: int, run_dir: Path, *, signals: tuple[int, ...]) -> int:
    """Run ``command`` as ``nproc`` ranks and wait; the job's exit status.

    The first of ``signals`` goes to the ranks: each finishes its step, the job writes a checkpoint, the ranks
    exit 0 and we return 128 + signal (0 if the run's last record is ``final``: the signal came after the
    last step). A second signal kills the ranks and exits at once. A signal the launcher was started
    ignoring (``nohup``) stays ignored.
    """
    job = LocalJob.start(command, nproc)
    forwarded: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        forwarded.append(signum)
        if len(forwarded) == 1:
            job.signal(signum)
            return
        _say(f"tierec: second {signal.Signals(signum).name}: stopping now")
        job.kill()  # gone before we are: a `--resume` right after us finds no live lock holder
        os._exit(128 + forwarded[0])

    old = {s: signal.signal(s, forward) for s in signals if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        end = job.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if any(p.poll() is None for p in job.procs):
            job.kill()  # the others: no checkpoint can be written without the rank that ended
        job.close()
    return _outcome(end, job.lines, forwarded, nproc, run_dir)


def _outcome(end: RankEnd | None, lines: list[str], forwarded: list[int], nproc: int, run_dir: Path) -> int:
    """Say how the job ended (one line, or the ranks' distinct error lines); its exit status."""
    if end is None:
        if forwarded and _last_record_kind(run_dir / "metrics.jsonl") == "interrupted":
            return 128 + forwarded[0]  # the ranks stopped on our signal and saved
        return 0
    if forwarded and end.signal == forwarded[0]:  # a rank that had not started catching signals yet
        _say(f"tierec: stopped on {signal.Signals(forwarded[0]).name} ({end.describe()})")
        return 128 + forwarded[0]
    resume = f"continue with `tierec train --nproc {nproc} --run-dir {shlex.quote(str(run_dir))} --resume`"
    if end.signal is not None:
        _say(f"tierec: error: {end.describe()}; stopped {_others(nproc)}; {resume}")
        return LOST_RANK_STATUS
    for line in lines:
        _say(line)
    if not lines:
        _say(f"tierec: error: {end.describe()}; stopped {_others(nproc)}; {resume}")
    return end.status


def _others(nproc: int) -> str:
    return "the other rank" if nproc == 2 else "the other ranks"


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:  # a hung-up terminal
        pass


def _last_record_kind(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            last = f.read().splitlines()[-1]
        return json.loads(last).get("kind")
    except (OSError, IndexError, ValueError, AttributeError):
        return None

