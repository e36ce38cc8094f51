"""Stopping a run without losing it: interrupts and a diverged loss.

``GracefulStop`` turns SIGINT, SIGTERM (what schedulers send before they
kill) and SIGHUP (a closed terminal or ssh session) into a request the
training loop reads after each step: it finishes the step, writes a
checkpoint and ends with ``Interrupted`` (exit status 130 for SIGINT, 143 for
SIGTERM, 129 for SIGHUP). A second signal ends the process at once. A signal
the process was started ignoring (``nohup``) stays ignored. On a SIGHUP,
stdout and stderr that are a terminal that hung up go to /dev/null: every
write to it fails, and must not end the run before its checkpoint.
``TrainingDiverged`` is raised for a NaN or infinite loss under
``train.nan_policy = "stop"``; the last checkpoint stays, so the run resumes.

>>> import os, signal
>>> with GracefulStop() as stop:
...     os.kill(os.getpid(), signal.SIGTERM)
...     stop.requested
15
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any


class Interrupted(Exception):
    """The run stopped on a signal after saving a checkpoint; ``status`` is the exit status."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.status = 128 + signum


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite (one line)."""


class GracefulStop:
    """Record the first SIGINT / SIGTERM / SIGHUP for the loop to act on; exit at once on the second."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, *, announce: bool = True) -> None:
        self.requested: int | None = None
        self.announce = announce  # say so on stderr (in a job: rank 0 only)
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.requested is not None:
            self._say(f"tierec: second {signal.Signals(signum).name}: stopping now\n")
            os._exit(128 + signum)
        self.requested = signum
        if signum == signal.SIGHUP:
            drop_hung_up_output()
        self._say(f"tierec: {signal.Signals(signum).name}: finishing this step and saving a checkpoint (again to stop at once)\n")

    def _say(self, line: str) -> None:
        if self.announce:
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except OSError:  # a hung-up terminal
                pass

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            self._old = {s: signal.signal(s, self._handle) for s in self.SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}


def drop_hung_up_output() -> None:
    """Point stdout and stderr at /dev/null where they are a terminal that hung up (every write fails, EIO)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            try:
                os.write(fd, b"")  # 0 bytes: nothing for a file, a pipe or a live terminal; EIO for a hung-up one
            except OSError:
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)
