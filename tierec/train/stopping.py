"""Stopping a run without losing it: interrupts and a diverged loss.

``GracefulStop`` turns SIGINT and SIGTERM (what schedulers send before they
kill) into a request the training loop reads after each step: it finishes the
step, writes a checkpoint and ends with ``Interrupted`` (exit status 130 for
SIGINT, 143 for SIGTERM). A second signal ends the process at once.
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
    """Record the first SIGINT / SIGTERM for the loop to act on; exit at once on the second."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, *, announce: bool = True) -> None:
        self.requested: int | None = None
        self.announce = announce  # say so on stderr (in a job: rank 0 only)
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.requested is not None:
            self._say(f"tierec: second {signal.Signals(signum).name}: stopping now\n")
            os._exit(128 + signum)
        self.requested = signum
        self._say(f"tierec: {signal.Signals(signum).name}: finishing this step and saving a checkpoint (again to stop at once)\n")

    def _say(self, line: str) -> None:
        if self.announce:
            sys.stderr.write(line)
            sys.stderr.flush()

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            self._old = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}
