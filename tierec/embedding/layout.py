"""RecordLayout: what a storage of whole rows holds per row, and the key spaces of its ids.

A record is ``dim`` weights, then each optimizer state in turn (``state``: its
shape after the row axis and its initial value), ``width`` float32 in all. Ids
are keyed by ``(key space, id)``; ``names`` name the key spaces (a table
group's tables; a chunk store's one space of chunk numbers) in counters,
statistics and errors. ``scales`` give new rows their seeded values, one scale
per key space (a table's ``init_scale``); without them new rows are zeros.

A table group's layout comes from its tables (:meth:`RecordLayout.of_tables`);
a tiered chunk pool (tierec/prune/tiered_pool.py) describes its chunk records
with :meth:`RecordLayout.chunks`, with no table behind them.

>>> from tierec.embedding.table import TableConfig
>>> RecordLayout.of_tables([TableConfig(name="t", dim=4, features=["f"])]).widths  # row-wise Adagrad: a float
{'sum': 1}
>>> chunks = RecordLayout.chunks("t.chunks", 4, {"exp_avg": 0.0, "exp_avg_sq": 0.0})
>>> chunks.width, chunks.names, chunks.scales is None
(12, ('t.chunks',), True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tierec.embedding.optimizers import initial_state_value, state_shapes
from tierec.embedding.table import TableConfig, group_layout, init_scales


@dataclass(frozen=True)
class StateColumn:
    """One optimizer state of a record."""

    shape: tuple[int, ...]  # after the row axis: () one float per row, (d,) one per dim
    initial: float  # its value in a new row


@dataclass(frozen=True)
class RecordLayout:
    names: tuple[str, ...]  # one per key space (table)
    dim: int  # weights per record
    state: dict[str, StateColumn]  # optimizer state beside the weights, in record order
    scales: np.ndarray | None  # [n_spaces] float32 init scale of new rows; None: new rows are zeros

    @classmethod
    def of_tables(cls, tables: list[TableConfig]) -> RecordLayout:
        """The rows of a table group: its tables' weights and their optimizer's state (tables must share both)."""
        dim, optimizer = group_layout(tables)
        shapes = state_shapes(optimizer.kind, dim)
        state = {n: StateColumn(s, initial_state_value(optimizer, n)) for n, s in shapes.items()}
        return cls(tuple(t.name for t in tables), dim, state, init_scales(tables))

    @classmethod
    def chunks(cls, name: str, chunk: int, dim_state: dict[str, float]) -> RecordLayout:
        """Chunk records: ``chunk`` weights, then ``chunk`` values of each per-dim state (``dim_state``: its
        initial value); one key space, ``name``, of chunk numbers; new chunks are zeros."""
        return cls((name,), chunk, {n: StateColumn((chunk,), v) for n, v in dim_state.items()}, None)

    @property
    def n_spaces(self) -> int:
        return len(self.names)

    @property
    def widths(self) -> dict[str, int]:
        """Float32 words of each optimizer state per record."""
        return {n: int(np.prod(c.shape, dtype=np.int64)) for n, c in self.state.items()}

    @property
    def width(self) -> int:
        """Float32 words per record: the weights, then every state."""
        return self.dim + sum(self.widths.values())

    def new_state(self, rows: int, device: torch.device | str) -> dict[str, Tensor]:
        """Optimizer state of ``rows`` new rows, by name (``[rows, *shape]`` each)."""
        return {
            n: torch.full((rows, *c.shape), c.initial, dtype=torch.float32, device=device) for n, c in self.state.items()
        }
