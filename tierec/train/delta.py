"""Delta checkpoints: between full checkpoints, only what changed since the last publication.

With ``train.delta_every = N`` a run publishes, every N steps between its full
checkpoints, a directory beside them::

    checkpoints/
      step_00001000/                     # a full checkpoint (tierec/train/checkpoint.py)
      delta_00001200_of_00001000/        # a delta: its step, the full checkpoint it is based on
        tensors.safetensors              # dense model, optimizer, RNG, the embeddings' counters (all small),
                                         #   (several processes: tensors-RRRRR and rows-RRRRR-* of each rank)
                                         #   and ``deleted/{prefix}/{table}``: ids deleted since the last one
        rows-00000-000000.safetensors    # records of the rows changed since the last publication (ids,
        meta.json                        #   weights, optimizer state), as a full checkpoint's row chunks
        checksums.json

A delta is written and published like a full checkpoint (a hidden directory,
synced, checksummed, renamed into place) but never moves ``latest``, and its
meta.json names the step of the publication before it (``delta.previous``: the
base or the delta before). A full checkpoint plus its chain of deltas (each
one's ``previous`` the step of the one before) restores the same state as a
full checkpoint at the last delta's step: ``--resume`` restores the newest full
checkpoint, then applies its deltas in order and stops at the first that is
missing or damaged. Deltas go when their full checkpoint is pruned.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from tierec.distributed.context import DistContext
from tierec.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    RowChunks,
    STEP_DIR,
    begin_checkpoint,
    check_meta,
    checkpoint_record,
    delta_dirs,
    publish_dir,
    remove_debris,
    write_part,
)


def delta_name(step: int, base: int) -> str:
    return f"delta_{step:08d}_of_{base:08d}"


def save_delta(
    run_dir: Path | str, step: int, base: int, previous: int, tensors: Mapping[str, Tensor], meta: Mapping[str, Any],
    rows: RowChunks = (), ctx: DistContext | None = None,
) -> Path:
    """Publish delta ``step`` of full checkpoint ``base`` (``previous``: the step of the publication
    before it); ``tensors``, ``rows`` and ``ctx`` as :func:`~tierec.train.checkpoint.save_checkpoint`
    takes them: with several processes a collective, every rank writing its own changed rows."""
    check_meta(step, None, meta)
    if not base <= previous < step:
        raise ValueError(f"a delta of step {step} needs base <= previous < step, got base {base}, previous {previous}")
    run_dir = Path(run_dir)
    name = delta_name(step, base)
    record = {**meta, "delta": {"base": base, "previous": previous}}
    if ctx is None or not ctx.is_distributed:
        tmp = begin_checkpoint(run_dir, step, name=name)
        try:
            write_part(tmp, 0, tensors, rows)
            final = publish_dir(run_dir, tmp, name, checkpoint_record(tmp, step, record, 1))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        remove_debris(run_dir)
        return final
    tmp = run_dir / f".tmp-{name}-sharded"
    if ctx.is_main:
        begin_checkpoint(run_dir, step, tag="sharded", name=name)
    ctx.barrier()
    write_part(tmp, ctx.rank, tensors, rows)  # every rank: its counters, deleted ids and changed rows
    ctx.barrier()
    if ctx.is_main:  # rank 0 publishes, once every part is written
        publish_dir(run_dir, tmp, name, checkpoint_record(tmp, step, record, ctx.world_size))
        remove_debris(run_dir)
    ctx.barrier()
    return run_dir / name


def apply_deltas(base: Path, meta: dict, apply: Callable[[Checkpoint], None], echo: Callable[[str], None]) -> dict:
    """Apply the chain of deltas of full checkpoint ``base`` (whose meta is ``meta``) in order, stopping at
    the first missing or damaged one; returns the meta of the last applied (``meta`` if none)."""
    m = STEP_DIR.fullmatch(base.name)
    if m is None:
        return meta
    at, base_step = int(meta["step"]), int(m.group(1))
    for step, of, path in delta_dirs(base.parent):
        if of != base_step or step <= at:
            continue
        try:
            delta = Checkpoint(path)  # every file's checksum verified before anything is applied
        except CheckpointError as e:
            echo(f"{e}; resuming from step {at}, the last intact delta")
            break
        with delta:
            previous = int(delta.meta.get("delta", {}).get("previous", -1))
            if previous != at:
                echo(f"{path.name} follows step {previous}, not {at}; resuming from step {at}")
                break
            apply(delta)  # an error now (a delta of another model) fails the checkpoint, as a full one's would
            meta = delta.meta
        at = step
    return meta
