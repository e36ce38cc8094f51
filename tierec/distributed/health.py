"""Liveness: every rank beats into the rendezvous store; a failed collective names the lost ranks.

Gloo reports a dead peer as "connection closed by peer [address]", or, if the
peer hangs, as a timeout after ``dist.timeout_s``; neither says which rank. So
each rank runs a ``Heartbeat``: a daemon thread that increments a counter in
the job's store every ``dist.heartbeat_s``. When a collective fails, the
survivor reads the counters twice, a few beats apart; ranks whose counter did
not move (or whose store cannot be reached) are the lost ones, and
``RankLostError`` says so in one line. Nothing here runs in the training
loop's hot path.

>>> from tierec.distributed.health import RankLostError
>>> str(RankLostError([1], "connection closed"))
'lost rank 1 (no heartbeat); stopping this rank: connection closed'
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import torch.distributed as dist

from tierec.distributed.context import DistContext

_PREFIX = "tierec/heartbeat/"


class RankLostError(RuntimeError):
    """A peer rank died or stopped responding; the message names it."""

    def __init__(self, ranks: list[int], detail: str) -> None:
        self.ranks = ranks
        who = ", ".join(str(r) for r in ranks)
        s = "s" if len(ranks) > 1 else ""
        super().__init__(f"lost rank{s} {who} (no heartbeat); stopping this rank: {' '.join(detail.split())[:300]}")


class Heartbeat:
    """A beat every ``interval_s`` into ``ctx.store``; ``lost_ranks()`` finds who stopped beating."""

    def __init__(self, ctx: DistContext, interval_s: float) -> None:
        self.ctx = ctx
        self.interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        if self.ctx.store is not None:
            self._beat()
            self._thread = threading.Thread(target=self._run, name="tierec-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            # A beat still inside the store client when the process exits would abort it.
            self._thread.join(timeout=2 * self.interval + 5)

    def _beat(self) -> int:
        return self.ctx.store.add(f"{_PREFIX}{self.ctx.rank}", 1)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat()
            except Exception:  # the store is gone (its host died): nothing left to tell
                return

    def _counts(self) -> list[int | None]:
        out: list[int | None] = []
        for r in range(self.ctx.world_size):
            try:
                out.append(self.ctx.store.add(f"{_PREFIX}{r}", 0))
            except Exception:
                out.append(None)
        return out

    def lost_ranks(self) -> list[int]:
        """Ranks whose beat stopped (read twice, three beats apart); [] when all are alive."""
        if self.ctx.store is None:
            return []
        try:
            self.ctx.store.set_timeout(timedelta(seconds=max(2 * self.interval, 1.0)))
        except Exception:
            pass
        before = self._counts()
        if all(c is None for c in before):
            # the store lives with rank 0 (or torchrun's agent on its node)
            return [0] if self.ctx.rank != 0 else []
        time.sleep(3 * self.interval)
        after = self._counts()
        return [r for r, (a, b) in enumerate(zip(before, after)) if r != self.ctx.rank and (a is None or b is None or a == b)]

    def diagnose(self, error: BaseException) -> BaseException:
        """A RankLostError naming the lost ranks, or ``error`` itself when every rank is alive."""
        if not isinstance(error, (RuntimeError, dist.DistError)):
            return error
        lost = self.lost_ranks()
        return RankLostError(lost, str(error)) if lost else error
