"""Everything a run must save to continue exactly: small tensors plus a JSON skeleton, and row chunks.

``snapshot_state`` gives the dense model, optimizer, RNG and the embeddings'
small state (group steps, store counters) as one flat tensor dict with its
skeleton; ``row_chunks`` streams every embedding row, a bounded chunk at a
time. ``restore_checkpoint`` reads them back from a :class:`Checkpoint`, one
chunk file at a time, keeping the rows this process owns.

>>> import tempfile
>>> from tierec.config import load_config
>>> from tierec.train.checkpoint import Checkpoint, save_checkpoint
>>> from tierec.train.components import Components
>>> from tierec.train.state import restore_checkpoint, row_chunks, snapshot_state
>>> parts = Components.build(load_config(None, ["embedding.dim=4"]), ["C1"], n_dense=1)
>>> tensors, skeleton = snapshot_state(parts)
>>> run = save_checkpoint(tempfile.mkdtemp(), 0, tensors, {"state": skeleton}, rows=row_chunks(parts))
>>> restore_checkpoint(parts, Checkpoint(run))
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import Tensor

from tierec.embedding.storage import combine_shards, is_count_entry

from tierec.train.checkpoint import (
    CHUNK_BYTES,
    Checkpoint,
    CheckpointError,
    capture_rng_state,
    flatten_state,
    restore_rng_state,
    unflatten_state,
)
from tierec.train.components import Components
from tierec.train.integrity import validate_tensors


def embedding_collections(parts: Components) -> list[tuple[str, Any]]:
    """(checkpoint prefix, collection) of each embedding collection a run has."""
    return [(name, c) for name, c in (("emb", parts.embeddings), ("wide", parts.wide)) if c is not None]


def snapshot_state(parts: Components) -> tuple[dict[str, Tensor], Any]:
    """Dense model and optimizer, RNG states, and the embeddings' non-row state (``{prefix}/...``)."""
    state: dict[str, Any] = {
        "model": parts.model.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "rng": capture_rng_state(),
    }
    tensors, skeleton = flatten_state(state)
    for name, coll in embedding_collections(parts):
        tensors.update({f"{name}/{k}": v for k, v in coll.state_meta().items()})
    return tensors, skeleton


def row_chunks(parts: Components, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[str, dict[str, Tensor]]]:
    """``("{prefix}/{table}", records)`` of every embedding row this process holds, in bounded chunks."""
    for name, coll in embedding_collections(parts):
        for table, records in coll.iter_rows(chunk_bytes):
            yield f"{name}/{table}", records


@contextmanager
def _must_fit() -> Iterator[None]:
    """A checkpoint of another model or config (shapes, keys) is a one-line CheckpointError, not a traceback."""
    try:
        yield
    except CheckpointError:
        raise
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"the checkpoint does not fit this model and config ({first[:200]})") from None


def _valid(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    problem = validate_tensors(tensors)
    if problem is not None:
        raise CheckpointError(f"checkpoint values are invalid: {problem}")
    return tensors


def restore_state(parts: Components, tensors: dict[str, Tensor], skeleton: Any) -> None:
    """Restore from one flat dict: ``snapshot_state`` output, or a whole checkpoint held in RAM (rows included)."""
    with _must_fit():
        _restore_flat(parts, _valid(tensors), skeleton)


def _restore_flat(parts: Components, tensors: dict[str, Tensor], skeleton: Any) -> None:
    _restore_dense(parts, tensors, skeleton)
    for name, coll in embedding_collections(parts):
        prefix = f"{name}/"
        part = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        if any(k.endswith(".ids") for k in part):
            coll.load_state_dict(part)
        else:
            coll.load_state_meta(part)
    _place_by_hotness(coll for _, coll in embedding_collections(parts))


def restore_checkpoint(parts: Components, ckpt: Checkpoint, rank: int = 0, world_size: int = 1) -> None:
    """Restore from a checkpoint saved on any number of processes, one chunk file in RAM at a time
    (values checked: finite floats, ids non-negative and unique within a chunk)."""
    with _must_fit():
        _restore_chunks(parts, ckpt, rank, world_size)


def _restore_chunks(parts: Components, ckpt: Checkpoint, rank: int = 0, world_size: int = 1) -> None:
    """Restore from a checkpoint saved on any number of processes, one chunk file in RAM at a time.

    Rows are handed to each collection's ``load_rows``, which keeps the ones
    this process owns. The embeddings' counters are this rank's own when the
    world size is unchanged, else rank 0's.
    """
    if "delta" in ckpt.meta:
        raise CheckpointError(f"{ckpt.path} is a delta checkpoint (the rows changed since step {ckpt.meta['delta']['previous']}); "
                              f"restore its full checkpoint, {ckpt.path.parent}, which applies its deltas on --resume")
    dense = _valid(ckpt.state(0))
    if ckpt.format < 2:  # every tensor in one file
        _restore_flat(parts, dense, ckpt.meta["state"])
        return
    _restore_dense(parts, dense, ckpt.meta["state"])
    if ckpt.world_size == world_size:
        own = ckpt.state(rank) if rank > 0 else dense
    else:  # another world size: the job's event counts (summed over the shards) go to rank 0 alone
        own = _job_counters(dense, [ckpt.state(r) for r in range(1, ckpt.world_size)], first=rank == 0)
    colls = dict(embedding_collections(parts))
    for name, coll in colls.items():
        prefix = f"{name}/"
        coll.load_state_meta({k[len(prefix) :]: v for k, v in own.items() if k.startswith(prefix)})
    del dense, own
    for label, records in ckpt.rows():
        name, table = label.split("/", 1)
        colls[name].load_rows(table, _valid(records))
    _place_by_hotness(colls.values())


def _place_by_hotness(collections) -> None:
    """Tiered stores after a load: the host tier takes the hottest of the rows it was handed."""
    for coll in collections:
        for group in coll.groups:
            for store in group.tier_stores():
                store.place_by_hotness()


def track_changes(parts: Components) -> None:
    """Every embedding collection notes its changed and deleted rows from now on (delta checkpoints)."""
    for _name, coll in embedding_collections(parts):
        coll.track_changes()


def mark_changes(parts: Components) -> None:
    """The state as of now is published: the collections forget the changes noted so far."""
    for _name, coll in embedding_collections(parts):
        coll.mark_changes()


DELETED = "deleted/"  # a delta's ids deleted since the publication before it: ``deleted/{prefix}/{table}``


def delta_state(parts: Components, chunk_bytes: int = CHUNK_BYTES) -> tuple[dict[str, Tensor], Any, Iterator[tuple[str, dict[str, Tensor]]]]:
    """What a delta checkpoint holds: :func:`snapshot_state`'s tensors plus the ids deleted since the last
    publication, its skeleton, and the records of the rows changed since then (streamed like
    :func:`row_chunks`). The collections must track changes (``track_changes``)."""
    tensors, skeleton = snapshot_state(parts)
    changes = [(name, coll, coll.changes()) for name, coll in embedding_collections(parts)]
    for name, coll, ch in changes:
        tensors.update({f"{DELETED}{name}/{table}": ids for table, ids in coll.deleted_ids(ch).items()})

    def rows() -> Iterator[tuple[str, dict[str, Tensor]]]:
        for name, coll, ch in changes:
            for table, records in coll.changed_rows(ch, chunk_bytes):
                yield f"{name}/{table}", records

    return tensors, skeleton, rows()


def restore_delta(parts: Components, delta: Checkpoint, rank: int = 0, world_size: int = 1) -> None:
    """Apply a delta checkpoint (saved on any number of processes) to the state of the publication before
    it (its full checkpoint or delta); each process keeps the rows it owns and forgets the deleted ones it
    holds. The embeddings' counters are this rank's own when the world size is unchanged, else the job's."""
    with _must_fit():
        dense = _valid(delta.state(0))
        _restore_dense(parts, dense, delta.meta["state"])
        others = [_valid(delta.state(r)) for r in range(1, delta.world_size)]  # small: counters, deleted ids
        if delta.world_size == world_size:
            counters = others[rank - 1] if rank > 0 else dense
        else:
            counters = _job_counters(dense, others, first=rank == 0)
        colls = dict(embedding_collections(parts))
        own = {name: {k[len(name) + 1 :]: v for k, v in counters.items() if k.startswith(f"{name}/")} for name in colls}
        for name, coll in colls.items():
            coll.catch_up(own[name])
        for label, records in delta.rows():
            name, table = label.split("/", 1)
            colls[name].load_rows(table, _valid(records))
        for part in [dense, *others]:
            for key, ids in part.items():
                if key.startswith(DELETED):
                    name, table = key[len(DELETED) :].split("/", 1)
                    colls[name].delete_rows(table, ids)
        for name, coll in colls.items():  # last: the counters as the delta recorded them, not the I/O of loading it
            coll.load_state_meta(own[name])


def _job_counters(dense: dict[str, Tensor], others: list[dict[str, Tensor]], *, first: bool) -> dict[str, Tensor]:
    """The embeddings' non-row state of a job as one process's: event counts summed over the shards
    (on ``first`` only, zeros elsewhere, so the job's sum is kept), the rest rank 0's. The pruner's
    budget (``prune.target_ratio``) counts the evicted rows, so the sum matters."""
    out = {}
    for k, v in dense.items():
        if "/" not in k:
            continue
        total = combine_shards(k, [v] + [o[k] for o in others if k in o])
        out[k] = total if first or not is_count_entry(k) else torch.zeros_like(total)
    return out


def _restore_dense(parts: Components, tensors: dict[str, Tensor], skeleton: Any) -> None:
    state = unflatten_state({k: v for k, v in tensors.items() if "/" not in k}, skeleton)
    parts.model.load_state_dict(state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    restore_rng_state(state["rng"])


def load_shard_rows(parts: Components, tensors: dict[str, Tensor]) -> None:
    """The embedding rows of one more shard of a checkpoint in the previous sharded format
    (each rank keeps the rows it owns)."""
    for name, coll in embedding_collections(parts):
        prefix = f"{name}/"
        coll.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
