"""Sharded checkpoints: one file per rank plus a manifest, loadable on any number of processes.

On disk (next to single-process checkpoints, same ``latest`` pointer and pruning)::

    checkpoints/
      step_00000100/
        manifest.json                       # world size, shard files and sizes, row-sharded names, meta
        shard-00000-of-00004.safetensors    # rank 0: dense model, optimizer, RNG, and its rows
        shard-00001-of-00004.safetensors    # rank 1: its rows
        ...
      latest

Every rank writes its shard into a hidden directory; rank 0 then writes the
manifest, renames the directory into place and only then moves ``latest``
(the directory must be on a file system every rank sees). The embedding state
is keyed by ids (``{table}.ids``, ``{table}.weights``, ``{table}.opt.*``), so
resharding is simple: a rank of the new job reads every shard and keeps the
rows it owns; one process (``load_any``) concatenates them.

>>> from tierec.distributed.checkpoint import shard_file
>>> shard_file(1, 4)
'shard-00001-of-00004.safetensors'
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from tierec.config import ConfigError
from tierec.distributed.context import DistContext
from tierec.embedding.storage import combine_shards
from tierec.paths import quote, safe_member
from tierec.train.checkpoint import (
    _STEP_DIR,
    LATEST_FILE,
    CheckpointError,
    _fsync_dir,
    _fsync_file,
    _prepare_tensors,
    _remove_debris,
    _step_dirs,
    _write_atomically,
    _write_durably,
    checkpoint_name,
    latest_checkpoint,
    load_checkpoint,
)

MANIFEST_FILE = "manifest.json"
SHARDED_FORMAT = 1
_REPLICATED = re.compile(r"(.*/)?group\d+\.step")  # a table group's update count: the same in every shard


def shard_file(rank: int, world: int) -> str:
    return f"shard-{rank:05d}-of-{world:05d}.safetensors"


def is_row_key(name: str) -> bool:
    """Embedding rows (``emb/{table}.ids`` etc.), which differ per shard and concatenate."""
    return "/" in name and not _REPLICATED.fullmatch(name)


# ------------------------------------------------------------------------ save


def save_sharded(
    ctx: DistContext, run_dir: Path | str, step: int, tensors: dict[str, Tensor], meta: dict[str, Any], keep: int = 2
) -> Path:
    """Every rank calls this with its own tensors; rank 0's ``meta`` and non-row tensors are kept.

    A collective: returns once the checkpoint is published on every rank.
    """
    run_dir = Path(run_dir)
    final = run_dir / checkpoint_name(step)
    tmp = run_dir / f".tmp-{final.name}-sharded"
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        _remove_debris(run_dir)
        tmp.mkdir()
    ctx.barrier()
    # 1. every rank writes its shard; non-row state (dense model, optimizer, RNG) only on rank 0
    mine = tensors if ctx.is_main else {k: v for k, v in tensors.items() if is_row_key(k)}
    path = tmp / shard_file(ctx.rank, ctx.world_size)
    save_file(_prepare_tensors(mine), path)
    _fsync_file(path)
    sizes = [0] * ctx.world_size
    size = path.stat().st_size
    if ctx.is_distributed:
        t = torch.zeros(ctx.world_size, dtype=torch.int64)
        t[ctx.rank] = size
        dist.all_reduce(t, group=ctx.dense_group)
        sizes = t.tolist()
    else:
        sizes = [size]
    # 2. rank 0 publishes: manifest, rename, then `latest`, then prunes
    if ctx.is_main:
        record = {
            **meta,
            "step": step,
            "_sharded": {
                "format": SHARDED_FORMAT,
                "world_size": ctx.world_size,
                "shards": [{"file": shard_file(r, ctx.world_size), "bytes": sizes[r]} for r in range(ctx.world_size)],
            },
        }
        _write_durably(tmp / MANIFEST_FILE, json.dumps(record, indent=1))
        _fsync_dir(tmp)
        if final.exists():
            os.replace(final, run_dir / f".trash-{final.name}-sharded")
        os.replace(tmp, final)
        _fsync_dir(run_dir)
        _write_atomically(run_dir / LATEST_FILE, final.name + "\n")
        for old in _step_dirs(run_dir)[:-keep]:
            if old.name != final.name:
                os.replace(old, run_dir / f".trash-{old.name}")
        _remove_debris(run_dir)
    ctx.barrier()
    return final


# ------------------------------------------------------------------------ load


def resolve_checkpoint(path_or_run_dir: Path | str) -> Path | None:
    """The checkpoint directory meant by a step directory or a run's checkpoints/ (its latest)."""
    path = Path(path_or_run_dir)
    if _STEP_DIR.fullmatch(path.name) or (path / MANIFEST_FILE).exists() or (path / "meta.json").exists():
        return path if path.is_dir() else None
    return latest_checkpoint(path)


def is_sharded(ckpt: Path) -> bool:
    return (ckpt / MANIFEST_FILE).is_file()


def read_manifest(ckpt: Path) -> dict[str, Any]:
    try:
        record = json.loads((ckpt / MANIFEST_FILE).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {ckpt} is corrupt: cannot read {MANIFEST_FILE} ({e})") from None
    info = record.get("_sharded")
    if not isinstance(info, dict) or "shards" not in info:
        raise CheckpointError(f"{ckpt / MANIFEST_FILE} is not a tierec sharded checkpoint manifest")
    if info.get("format", 0) > SHARDED_FORMAT:
        raise CheckpointError(f"checkpoint {ckpt} has sharded format {info['format']}; this tierec reads {SHARDED_FORMAT}")
    return record


def iter_shards(ckpt: Path) -> Iterator[dict[str, Tensor]]:
    """The tensors of each shard in rank order (the first holds the dense state), checked against the manifest."""
    for entry in read_manifest(ckpt)["_sharded"]["shards"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or not isinstance(entry.get("bytes"), int):
            raise CheckpointError(f"{ckpt / MANIFEST_FILE}: malformed shard entry {quote(entry)} (needs file and bytes)")
        try:
            p = ckpt / safe_member(entry["file"], str(ckpt / MANIFEST_FILE))
        except ConfigError as e:
            raise CheckpointError(str(e)) from None
        if not p.is_file():
            raise CheckpointError(f"checkpoint {ckpt} is incomplete: {entry['file']} is missing")
        if p.stat().st_size != entry["bytes"]:
            raise CheckpointError(f"checkpoint {ckpt} is corrupt: {entry['file']} has {p.stat().st_size} bytes, "
                                  f"expected {entry['bytes']}")
        try:
            yield load_file(p)
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint {ckpt} is corrupt: cannot read {entry['file']} ({e})") from None


def checkpoint_meta(ckpt: Path) -> dict[str, Any]:
    """The caller's meta of a sharded checkpoint (position, state skeleton, config, step)."""
    record = read_manifest(ckpt)
    record.pop("_sharded")
    return record


def load_any(path_or_run_dir: Path | str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``(tensors, meta)`` of a single-process or sharded checkpoint, as one process would have saved it."""
    ckpt = resolve_checkpoint(path_or_run_dir)
    if ckpt is None or not is_sharded(ckpt):
        return load_checkpoint(path_or_run_dir)
    merged: dict[str, list[Tensor]] = {}
    for shard in iter_shards(ckpt):
        for k, v in shard.items():
            if is_row_key(k):
                merged.setdefault(k, []).append(v)
            else:
                merged.setdefault(k, [v])
    # a table's entries combine by kind (rows concatenate, counters add; tierec/embedding/storage.py)
    tensors = {k: (combine_shards(k, v) if is_row_key(k) else v[0]) for k, v in merged.items()}
    return tensors, checkpoint_meta(ckpt)
