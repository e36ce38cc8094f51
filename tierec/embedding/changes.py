"""Which rows of a table group changed since the last publication (delta checkpoints).

A storage that tracks changes (its :class:`ChangeTracker`, started) notes every ``(table, id)``
pair whose row was written (optimizer update, insertion, overwrite) and every
pair it deleted (``store.ttl_steps``, ``store.max_rows``); moves between tiers
are no changes. ``since_mark()`` gives, per table, the ids changed and
the ids deleted since the last ``mark()``: the last event of a pair wins (an id
deleted and then inserted again is changed; one changed and then deleted is
deleted). Events are kept as arrays, one per call, and resolved only when asked,
so noting costs an append per step.

>>> import numpy as np
>>> log = ChangeLog()
>>> log.changed(np.array([5, 6]), np.array([0, 0]))
>>> log.deleted(np.array([6]), np.array([0]))
>>> c = log.since_mark(n_tables=1)
>>> c.changed[0].tolist(), c.deleted[0].tolist()
([5], [6])
>>> log.mark(); log.since_mark(n_tables=1).changed[0].size
0
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class RowChanges:
    """Per table of a group (by position): ids changed [n] int64 and ids deleted [m] int64, both sorted."""

    changed: list[np.ndarray]
    deleted: list[np.ndarray]


class ChangeLog:
    def __init__(self) -> None:
        self._events: list[tuple[np.ndarray, np.ndarray, bool]] = []  # (ids, tables, deleted)

    def changed(self, keys: np.ndarray, tabs: np.ndarray) -> None:
        if len(keys):
            self._events.append((np.array(keys, dtype=np.int64), np.array(tabs, dtype=np.int32), False))

    def deleted(self, keys: np.ndarray, tabs: np.ndarray) -> None:
        if len(keys):
            self._events.append((np.array(keys, dtype=np.int64), np.array(tabs, dtype=np.int32), True))

    def mark(self) -> None:
        """Forget every event: the state as of now is published."""
        self._events = []

    def since_mark(self, n_tables: int) -> RowChanges:
        if not self._events:
            empty = [np.empty(0, dtype=np.int64) for _ in range(n_tables)]
            return RowChanges(empty, list(empty))
        keys = np.concatenate([e[0] for e in self._events])
        tabs = np.concatenate([e[1] for e in self._events])
        gone = np.concatenate([np.full(e[0].size, e[2]) for e in self._events])
        order = np.lexsort((np.arange(keys.size), keys, tabs))  # by table, id, then time
        keys, tabs, gone = keys[order], tabs[order], gone[order]
        last = np.ones(keys.size, dtype=bool)
        last[:-1] = (keys[1:] != keys[:-1]) | (tabs[1:] != tabs[:-1])  # the last event of each pair
        keys, tabs, gone = keys[last], tabs[last], gone[last]
        return RowChanges(
            [keys[(tabs == t) & ~gone] for t in range(n_tables)],
            [keys[(tabs == t) & gone] for t in range(n_tables)],
        )


class ChangeTracker:
    """Change tracking of one storage keyed by ``(table, id)``: a part the storage holds as ``changes``.

    Off (every note a no-op) until :meth:`start`. The storage calls :meth:`changed` when it writes rows
    and :meth:`deleted` when it forgets them; whoever publishes the rows asks :meth:`since_mark` and
    calls :meth:`mark` (tierec/embedding/collection.py).

    >>> tr = ChangeTracker(n_tables=1)
    >>> tr.changed(np.array([5]), np.array([0])); tr.on  # off: nothing noted
    False
    >>> tr.start(); tr.changed(np.array([5]), np.array([0])); tr.since_mark().changed[0].tolist()
    [5]
    """

    def __init__(self, n_tables: int) -> None:
        self.n_tables = n_tables
        self.log: ChangeLog | None = None  # off until ``start``

    @property
    def on(self) -> bool:
        return self.log is not None

    def start(self) -> None:
        """Start noting changed and deleted rows (a no-op when already tracking)."""
        if self.log is None:
            self.log = ChangeLog()

    def since_mark(self) -> RowChanges:
        """Per table: the ids changed and the ids deleted since the last :meth:`mark`."""
        if self.log is None:
            raise RuntimeError("changes since the mark need tracking started first (start())")
        return self.log.since_mark(self.n_tables)

    def mark(self) -> None:
        """The state as of now is published: forget the changes noted so far."""
        if self.log is not None:
            self.log.mark()

    def changed(self, keys: np.ndarray, tabs: np.ndarray) -> None:
        if self.log is not None:
            self.log.changed(keys, tabs)

    def deleted(self, keys: np.ndarray, tabs: np.ndarray) -> None:
        if self.log is not None:
            self.log.deleted(keys, tabs)
