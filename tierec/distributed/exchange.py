"""Row ownership and the traffic of the exchanges that move ids, rows and gradients (``wire.all_to_all``).

Every (table, id) has one owner rank, a hash of the pair built on the engine's
``key_hash`` (so it never depends on insertion order, process or run). The
owner hash is salted and mixed once more, because the owner's own hash index
places rows by the low bits of ``key_hash``: without the extra mix every row a
rank owns would share those bits and crowd 1/W of the index's slots.

``Ownership`` is that function for one rank among the ranks the rows are
sharded over. ``Traffic`` counts what each exchange sends to other ranks (bytes to itself
are a local copy and are not counted) and how long the caller was blocked.

>>> import numpy as np
>>> from tierec.distributed.exchange import owner_of
>>> o = owner_of(np.arange(10_000, dtype=np.int64), np.zeros(10_000, dtype=np.int32), 4)
>>> bool(np.bincount(o, minlength=4).min() > 2300)
True
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba as nb
import numpy as np

from tierec.embedding.kernels import key_hash, mix64

_OWNER_SALT = np.uint64(0xD6E8FEB86659FD93)


@nb.njit(parallel=True, cache=True)
def _owners(keys, tabs, world, out):
    for i in nb.prange(keys.shape[0]):
        out[i] = np.int32(mix64(key_hash(tabs[i], keys[i]) ^ _OWNER_SALT) % np.uint64(world))


def owner_of(keys: np.ndarray, tabs: np.ndarray, world: int) -> np.ndarray:
    """Owner rank [N] int32 of each (table, key); ``tabs`` are table indices within a group."""
    out = np.empty(keys.shape[0], dtype=np.int32)
    if world == 1:
        out.fill(0)
    elif keys.shape[0]:
        _owners(keys, tabs.astype(np.int32, copy=False), np.int64(world), out)
    return out


@dataclass(frozen=True)
class Ownership:
    """Who owns each (table, id) among ``world`` ranks, and whether this one (``rank``) does."""

    world: int  # the ranks the rows are sharded over (a group of the mesh, or the job)
    rank: int  # this rank among them

    def owner_of(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:  # [N] int32
        return owner_of(keys, tabs, self.world)

    def owns(self, keys: np.ndarray, tabs: np.ndarray) -> np.ndarray:  # [N] bool
        return self.owner_of(keys, tabs) == self.rank


@dataclass
class Traffic:
    """Bytes sent to other ranks and seconds blocked, per exchange kind, summed over steps."""

    bytes_sent: dict[str, int] = field(default_factory=dict)  # kind -> bytes
    seconds: dict[str, float] = field(default_factory=dict)  # kind -> seconds the caller waited
    steps: int = 0  # training steps counted

    def add(self, kind: str, nbytes: int = 0, seconds: float = 0.0) -> None:
        self.bytes_sent[kind] = self.bytes_sent.get(kind, 0) + int(nbytes)
        self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds

    def reset(self) -> None:
        self.bytes_sent.clear()
        self.seconds.clear()
        self.steps = 0

    def merge(self, other: Traffic) -> None:
        for k, v in other.bytes_sent.items():
            self.add(k, nbytes=v)
        for k, v in other.seconds.items():
            self.add(k, seconds=v)

    def per_step(self) -> dict[str, float]:
        n = max(self.steps, 1)
        out = {f"bytes/{k}": v / n for k, v in self.bytes_sent.items()}
        out.update({f"seconds/{k}": v / n for k, v in self.seconds.items()})
        out["bytes/total"] = sum(self.bytes_sent.values()) / n
        return out


def off_rank_bytes(splits: list[int], rank: int, row_bytes: int) -> int:
    """Bytes of an all-to-all that leave this rank (``splits`` rows per destination)."""
    return (sum(splits) - splits[rank]) * row_bytes
