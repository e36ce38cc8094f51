"""The signal tests' processes start with SIGINT at its default, whoever runs pytest.

A shell without job control starts its background commands with SIGINT ignored, and an ignored signal stays
ignored across exec: the processes these tests start would then ignore the SIGINT they are sent (tierec keeps
a signal its caller ignored ignored, as `nohup` expects), and the tests would fail on how pytest was started.
Python's own handler in pytest itself is reset to the default in every child at exec.
"""

from __future__ import annotations

import signal

import pytest


@pytest.fixture(autouse=True, scope="session")
def sigint_not_ignored() -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
