"""Checkpoint state of a TieredGroup (a mixin): every tier's rows plus the statistics.

``table_state(t)`` returns the plain group's keys (``ids``, ``weights``,
``opt.*``) over the rows of every tier, ordered by id, plus ``store.freq`` and
``store.last`` per row and the table's ``store.counters``; table 0 also carries
the group's clocks and the admission sketch. A plain TableGroup loads such a
state (it ignores the ``store.*`` keys) and a TieredGroup loads a plain one.
Loaded rows go to host, then disk; the fast tier warms up again as batches
arrive, which changes no number.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from tierec.embedding.group import select_rows
from tierec.store.directory import LOC_DISK, LOC_HOST
from tierec.store.spec import Counter

_PER_ROW = ("store.freq", "store.last")


class TierState:
    def table_state(self, t: int) -> dict[str, Tensor]:
        with self._lock:
            d = self.index
            lids = d.of_table(t)
            rec = self.read_rows(lids)  # [n, W]
            n = lids.size
            out = {"ids": torch.from_numpy(d.keys[lids].copy()), "weights": torch.from_numpy(rec[:, : self.dim].copy())}
            col = self.dim
            for name, s in self.state.items():
                w = self._state_widths[name]
                out[f"opt.{name}"] = torch.from_numpy(rec[:, col : col + w].reshape(n, *s.shape[1:]).copy())
                col += w
            out["store.freq"] = torch.from_numpy(d.freq[lids].copy())
            out["store.last"] = torch.from_numpy(d.last[lids].copy())
            out["store.counters"] = torch.from_numpy(self.counters[t].copy())
            if t == 0:
                added = self.sketch.added if self.sketch is not None else 0
                out["store.clock"] = torch.tensor([self.clock, self.train_steps, self.max_batch_rows, added])
                if self.sketch is not None:
                    out["store.sketch"] = torch.from_numpy(self.sketch.table.astype(np.int64))
            return out

    def load_table_state(self, t: int, sd: dict[str, Tensor], keep: np.ndarray | None = None, totals: bool = True) -> None:
        """Rows of ``table_state`` output (where ``keep``); the event counters are set, or with ``keep``
        (one shard of many) added, when ``totals``."""
        sd = select_rows(sd, keep, _PER_ROW)
        with self._lock:
            if "store.clock" in sd:
                self.clock, self.train_steps, self.max_batch_rows, added = (int(x) for x in sd["store.clock"])
                if self.sketch is not None and "store.sketch" in sd:
                    self.sketch.table[...] = sd["store.sketch"].numpy()
                    self.sketch.added = added
            if "store.counters" in sd and totals:
                c = sd["store.counters"].numpy()[: len(Counter)]
                self.counters[t, : c.shape[0]] = c + (self.counters[t, : c.shape[0]] if keep is not None else 0)
            ids = sd["ids"].numpy().astype(np.int64, copy=False)
            n = ids.shape[0]
            rec = np.empty((n, self.record_width), dtype=np.float32)
            rec[:, : self.dim] = sd["weights"].numpy()
            col = self.dim
            for name in self.state:
                w = self._state_widths[name]
                rec[:, col : col + w] = sd[f"opt.{name}"].numpy().reshape(n, w)
                col += w
            freq = sd["store.freq"].numpy() if "store.freq" in sd else None
            last = sd["store.last"].numpy() if "store.last" in sd else None
            self._put(ids, np.full(n, t, dtype=np.int32), rec, freq, last)

    def write_records(self, keys: np.ndarray, tabs: np.ndarray, records: np.ndarray) -> None:
        """Overwrite (or insert) rows with ``records`` [n, W]; known rows keep their access statistics."""
        with self._lock:
            self._put(keys, tabs.astype(np.int32, copy=False), np.ascontiguousarray(records, dtype=np.float32))

    def _put(self, ids: np.ndarray, tabs: np.ndarray, rec: np.ndarray, freq=None, last=None) -> None:
        d = self.index
        n = ids.shape[0]
        lids = d.find(ids, tabs)
        known = np.flatnonzero(lids >= 0)
        if known.size:  # overwrite rows in place: cached copies in the cache, others re-homed
            kl = lids[known]
            cs = d.cslot[kl].astype(np.int64)
            res = cs >= 0
            self._scatter(cs[res], rec[known[res]])
            self.dirty[cs[res]] = True
            away = kl[~res]
            loc = d.loc[away]
            if self.host is not None:
                self.host.free(d.home[away[loc == LOC_HOST]])
            if self.disk is not None:
                self.disk.free(d.home[away[loc == LOC_DISK]])
            d.loc[away] = 0
            d.home[away] = -1
            if freq is not None:
                d.freq[kl] = freq[known]
            if last is not None:
                d.last[kl] = last[known]
            self._store_home(away, rec[known[~res]])
        new = np.flatnonzero(lids < 0)
        if new.size:
            nl = d.insert(ids[new], tabs[new])
            d.freq[nl] = freq[new] if freq is not None else np.zeros(new.size, dtype=np.float32)
            d.last[nl] = last[new] if last is not None else np.full(new.size, self.train_steps, dtype=np.int64)
            self._store_home(nl, rec[new])
