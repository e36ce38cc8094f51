"""Cross-group collectives on the ``replica`` dimension: sums of sparse rows and dense buffers, compressed.

Everything here runs on a ``layout.Layout.replica_group`` (the ranks that hold the
same shard in every group, one per group) and sends what the codec of
``dist.compress`` makes of it, with error feedback for the lossy codecs
(``codecs.RowResiduals`` / ``codecs.DenseResiduals``).

- ``replica_sum_rows``: each replica contributes values for its own set of
  (table, id) rows; every replica gets the union of the rows and, per row, the
  sum of the contributions. One all-to-all carries each replica's rows (id,
  table and payload) to every other replica; every replica then decodes all
  payloads, its own included, and adds them in replica order, so the replicas
  end with bit-identical sums (their copies of a row never drift apart).
- ``replica_sum_dense``: the same for a flat dense buffer (an all-reduce when
  uncompressed; an all-gather of payloads added in replica order otherwise).

Bytes are counted in a ``Traffic`` under ``cross/<kind>``: what this rank sends
to other ranks (its own copy is local).

>>> import numpy as np, torch
>>> from tierec.distributed.codecs import codec
>>> from tierec.distributed.cross import replica_sum_rows
>>> k, t, s = replica_sum_rows(np.array([4, 2]), np.zeros(2, dtype=np.int32), torch.ones(2, 3), codec("none"), None, None)
>>> k.tolist(), s.tolist()
([4, 2], [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from tierec.distributed.codecs import Codec, DenseResiduals, RowResiduals, decode_flat, encode_flat
from tierec.distributed.exchange import Traffic
from tierec.distributed import wire
from tierec.distributed.wire import all_to_all
from tierec.embedding.hash_index import Deduper

_KEY_BYTES = 12  # int64 id + int32 table in front of each row's payload

CROSS = "cross/"  # prefix of the Traffic kinds that cross groups


def _pack(keys: np.ndarray, tabs: np.ndarray, payload: Tensor) -> Tensor:  # -> [N, 12 + P] uint8
    k = np.ascontiguousarray(keys, dtype=np.int64).view(np.uint8).reshape(-1, 8)
    t = np.ascontiguousarray(tabs, dtype=np.int32).view(np.uint8).reshape(-1, 4)
    return torch.cat([torch.from_numpy(k), torch.from_numpy(t), payload], 1)


def _unpack(packed: Tensor) -> tuple[np.ndarray, np.ndarray, Tensor]:
    raw = packed.numpy()
    keys = np.ascontiguousarray(raw[:, :8]).view(np.int64).reshape(-1)
    tabs = np.ascontiguousarray(raw[:, 8:12]).view(np.int32).reshape(-1)
    return keys, tabs, packed[:, _KEY_BYTES:]


def replica_sum_rows(
    keys: np.ndarray,  # [N] distinct (table, id) pairs this replica contributes
    tabs: np.ndarray,  # [N]
    values: Tensor,  # [N, D] float32
    c: Codec,
    residuals: RowResiduals | None,  # error feedback for lossy codecs (None: none kept)
    group: dist.ProcessGroup | None,  # the replica group; None = one replica
    traffic: Traffic | None = None,
    kind: str = "rows",
) -> tuple[np.ndarray, np.ndarray, Tensor]:
    """(keys [U], tables [U], sums [U, D]) over the union of every replica's rows, in replica order."""
    dim = values.shape[1]
    if residuals is not None:
        payload = residuals.encode(c, keys, tabs, values)
    else:
        payload = c.encode(values)
    packed = _pack(keys, tabs, payload)  # [N, 12 + P]
    if group is None:
        recv, counts = packed, [packed.shape[0]]
    else:
        t0 = time.perf_counter()
        r, me = dist.get_world_size(group), dist.get_rank(group)
        n = torch.tensor([packed.shape[0]], dtype=torch.int64)
        counts = wire.all_gather_single(torch.empty(r, dtype=torch.int64), n, group).tolist()
        send = packed.repeat(r, 1)  # the same rows to every replica, itself included
        recv = all_to_all(send, [packed.shape[0]] * r, counts, group).out
        if traffic is not None:
            traffic.add(CROSS + kind, (r - 1) * (packed.numel() + 8), time.perf_counter() - t0)
    all_keys, all_tabs, all_payload = _unpack(recv)
    decoded = c.decode(all_payload, dim)  # [M, D], replica order
    ukeys, utabs, inverse = Deduper()(all_keys, all_tabs)
    sums = torch.zeros(ukeys.shape[0], dim).index_add_(0, torch.from_numpy(inverse), decoded)
    return ukeys, utabs, sums


def replica_sum_dense(
    flat: Tensor,  # [n] float32
    c: Codec,
    residuals: DenseResiduals | None,
    key: object,  # the buffer's name for error feedback
    group: dist.ProcessGroup | None,
    traffic: Traffic | None = None,
    kind: str = "dense",
) -> Tensor:
    """The sum over replicas of ``flat`` [n] (the same on every replica), on ``flat``'s device."""
    if group is None:
        return flat.clone()
    home, flat = flat.device, flat.cpu()  # the codecs and their residuals live on the host
    r = dist.get_world_size(group)
    t0 = time.perf_counter()
    if not c.lossy:
        out = flat.detach().float().clone()
        wire.all_reduce(out, group)
        sent = 2 * (r - 1) * out.numel() * 4 // r  # a ring all-reduce
    else:
        payload = residuals.encode(key, c, flat) if residuals is not None else encode_flat(c, flat)
        every = wire.all_gather_single(payload.new_empty((r * payload.shape[0], *payload.shape[1:])), payload,
                                       group).chunk(r)
        out = torch.zeros(flat.numel())
        for p in every:  # replica order: every replica adds the same numbers in the same order
            out += decode_flat(c, p, flat.numel())
        sent = (r - 1) * payload.numel()
    if traffic is not None:
        traffic.add(CROSS + kind, sent, time.perf_counter() - t0)
    return out.to(home)
