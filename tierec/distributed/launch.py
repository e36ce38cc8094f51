"""Starting processes: the torchrun command line, local spawning for tests, dying with the parent.

``torchrun_command`` builds the ``python -m torch.distributed.run --standalone
--nproc_per_node N -m tierec ...`` line that ``tierec train --nproc N`` runs
(tierec/train/launch.py) under ``run_launcher``. ``spawn`` starts
N local processes without torchrun (tests and benchmarks): each gets the
environment torchrun would give it, joins the job with ``init_distributed``
and calls ``fn(ctx, *args)``.

>>> from tierec.distributed.launch import torchrun_command
>>> torchrun_command(2, ["train", "--nproc", "2", "--run-dir", "r"])[3:]
['--standalone', '--nproc_per_node', '2', '-m', 'tierec', 'train', '--run-dir', 'r']
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from tierec.config import DistConfig

# What every job imports, loaded once into the fork server. torch._dynamo is imported
# lazily by the first torch.optim optimizer and costs seconds.
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.nn.parallel", "tierec.train.trainer"]


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


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """The command line that runs ``tierec <argv>`` (minus ``--nproc``) on ``nproc`` local processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "tierec", *strip_nproc(argv)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    rank: int, world: int, port: int, cfg: DistConfig, fn: Callable, args: tuple, env: dict[str, str], log_dir: str | None
) -> None:
    from tierec.distributed.context import init_distributed

    if log_dir is not None:  # like torchrun --redirects 3: this rank's stdout and stderr to a file
        log = open(Path(log_dir) / f"rank{rank}.log", "w", buffering=1)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    os.environ.update(env)
    os.environ.update({
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })
    ctx = init_distributed(cfg, threads=1)
    fn(ctx, *args)
    ctx.close()  # only after a clean finish: tearing down a broken group can block


def spawn(
    fn: Callable[..., Any],
    nprocs: int,
    args: tuple = (),
    *,
    cfg: DistConfig | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
    check: bool = True,
    log_dir: str | Path | None = None,
) -> list[int]:
    """Run ``fn(ctx, *args)`` on ``nprocs`` fresh local processes (gloo); returns their exit codes.

    With ``check`` a non-zero exit raises; with ``log_dir`` rank r's output goes to
    ``log_dir/rank{r}.log``. Unlike torch.multiprocessing's join, a
    failed process does not get the others killed: they must notice by
    themselves (what the fault tests check). ``fn`` must be importable by name.
    Processes come from a fork server that has imported torch and tierec once
    (later jobs start in milliseconds), never from a fork of the caller, whose
    numba worker threads would not survive it.
    """
    cfg = cfg or DistConfig(timeout_s=60)
    port = free_port()
    mpc = multiprocessing.get_context("forkserver")
    mpc.set_forkserver_preload(_PRELOAD)
    logs = None if log_dir is None else str(log_dir)
    procs = [mpc.Process(target=_entry, args=(r, nprocs, port, cfg, fn, args, env or {}, logs)) for r in range(nprocs)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(timeout=max(deadline - time.monotonic(), 0.01))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join()
    if hung:
        raise TimeoutError(f"ranks {hung} of a spawned job did not finish within {timeout_s:.0f}s")
    codes = [p.exitcode for p in procs]
    if check and any(codes):
        raise RuntimeError(f"spawned job failed: exit codes by rank {codes}")
    return codes


def die_with_parent(sig: int) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (PR_SET_PDEATHSIG); a no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call
        os.kill(os.getpid(), sig)


LAUNCHER_ENV = "TIEREC_LAUNCHER_PID"  # set by `--nproc N` for its ranks: an interrupted rank then exits 0 (below)


def run_launcher(cmd: list[str], run_dir: Path) -> int:
    """Run torchrun as a child that dies with us; a SIGINT / SIGTERM goes to the ranks; the exit status.

    The first signal goes straight to the ranks (torchrun's children): each finishes its step, the job
    writes a checkpoint, and the ranks exit 0 so that torchrun ends quietly; we then exit 130 / 143.
    torchrun itself is not signalled: it would print its own traceback and kill the ranks after its
    shutdown timeout, even mid-checkpoint. A second signal kills torchrun and the ranks at once.
    """
    # Its own session: a terminal's Ctrl-C reaches only us. PDEATHSIG: if we are killed, torchrun is told to
    # stop too (and the ranks die with torchrun).
    env = {**os.environ, LAUNCHER_ENV: str(os.getpid())}
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets anyway, without its banner saying so
    proc = subprocess.Popen(cmd, env=env, preexec_fn=lambda: die_with_parent(signal.SIGTERM), start_new_session=True)
    forwarded: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        forwarded.append(signum)
        ranks = child_pids(proc.pid)
        if len(forwarded) > 1 or not ranks:  # a second signal, or no rank has started yet: stop at once
            if len(forwarded) > 1:
                sys.stderr.write(f"tierec: second {signal.Signals(signum).name}: stopping now\n")
            proc.kill()
            for pid in ranks:
                _kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 2.0  # gone before we are: a `--resume` right after us finds no live lock holder
            while any(_running(pid) for pid in ranks) and time.monotonic() < deadline:
                time.sleep(0.01)
            sys.stderr.flush()
            os._exit(128 + forwarded[0])
        for pid in ranks:
            _kill(pid, signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                code = proc.wait()
                break
            except InterruptedError:
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if code < 0:  # torchrun itself was killed by a signal
        return 128 - code
    if forwarded and code == 0 and _last_record_kind(run_dir / "metrics.jsonl") == "interrupted":
        return 128 + forwarded[0]  # the ranks stopped on our signal and saved (not: it came after the last step)
    return code


def _last_record_kind(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            last = f.read().splitlines()[-1]
        return json.loads(last).get("kind")
    except (OSError, IndexError, ValueError, AttributeError):
        return None


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc; empty elsewhere)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(name))
    return found


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
