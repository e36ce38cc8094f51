"""Reading checkpoints of the previous sharded format, and ``load_any`` for either format.

Checkpoints saved on several processes are now the single-process format
(:mod:`tierec.train.checkpoint`, ``save_checkpoint`` with a ``ctx``): every
rank's part in the same directory. Checkpoints of the previous sharded format
(``manifest.json`` and one ``shard-RRRRR-of-WWWWW.safetensors`` per rank) are
still read: whole by ``load_any`` (one process, ``tierec eval`` / ``predict``),
or shard by shard by ``restore_sharded`` (every rank of a job keeps the rows
it owns).

>>> from tierec.train.sharded_checkpoint import shard_file
>>> shard_file(1, 4)
'shard-00001-of-00004.safetensors'
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Iterator

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import Tensor

from tierec.config import ConfigError
from tierec.distributed.context import DistContext
from tierec.embedding.storage import combine_shards
from tierec.paths import member_path, quote
from tierec.train.checkpoint import STEP_DIR, CheckpointError, latest_checkpoint, linked, load_checkpoint

MANIFEST_FILE = "manifest.json"  # the previous sharded format
SHARDED_FORMAT = 1
_REPLICATED = re.compile(r"(.*/)?group\d+\.step")  # a table group's update count: the same in every shard


def shard_file(rank: int, world: int) -> str:
    return f"shard-{rank:05d}-of-{world:05d}.safetensors"


def is_row_key(name: str) -> bool:
    """Embedding rows (``emb/{table}.ids`` etc.), which differ per shard and concatenate."""
    return "/" in name and not _REPLICATED.fullmatch(name)


# ------------------------------------------------------------------------ load


def resolve_checkpoint(path_or_run_dir: Path | str) -> Path | None:
    """The checkpoint directory meant by a step directory or a run's checkpoints/ (its latest); never a link."""
    path = Path(path_or_run_dir)
    if STEP_DIR.fullmatch(path.name) or (path / MANIFEST_FILE).exists() or (path / "meta.json").exists():
        ckpt = path if path.is_dir() else None
    else:
        ckpt = latest_checkpoint(path)
    if ckpt is not None and ckpt.is_symlink():
        raise linked(ckpt)
    return ckpt


def is_sharded(ckpt: Path) -> bool:
    return (ckpt / MANIFEST_FILE).is_file()


def read_manifest(ckpt: Path) -> dict[str, Any]:
    if ckpt.is_symlink():
        raise linked(ckpt)
    try:
        record = json.loads(_member(ckpt, MANIFEST_FILE).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {ckpt} is corrupt: cannot read {MANIFEST_FILE} ({e})") from None
    info = record.get("_sharded")
    if not isinstance(info, dict) or "shards" not in info:
        raise CheckpointError(f"{ckpt / MANIFEST_FILE} is not a tierec sharded checkpoint manifest")
    if info.get("format", 0) > SHARDED_FORMAT:
        raise CheckpointError(f"checkpoint {ckpt} has sharded format {info['format']}; this tierec reads {SHARDED_FORMAT}")
    return record


def iter_shards(ckpt: Path) -> Iterator[dict[str, Tensor]]:
    """The tensors of each shard in rank order (the first holds the dense state), checked against the manifest.

    Every shard is checked (name, size, header) before the first is yielded: a job restores shards as they come,
    so a damaged later shard must not leave the rows of earlier ones behind when resume falls back to an older
    checkpoint.
    """
    paths = [_checked_shard(ckpt, entry) for entry in read_manifest(ckpt)["_sharded"]["shards"]]
    for p in paths:
        try:
            yield load_file(p)
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint {ckpt} is corrupt: cannot read {p.name} ({e})") from None


def _checked_shard(ckpt: Path, entry: Any) -> Path:
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or not isinstance(entry.get("bytes"), int):
        raise CheckpointError(f"{ckpt / MANIFEST_FILE}: malformed shard entry {quote(entry)} (needs file and bytes)")
    p = _member(ckpt, entry["file"])
    if not p.is_file():
        raise CheckpointError(f"checkpoint {ckpt} is incomplete: {entry['file']} is missing")
    if p.stat().st_size != entry["bytes"]:
        raise CheckpointError(f"checkpoint {ckpt} is corrupt: {entry['file']} has {p.stat().st_size} bytes, "
                              f"expected {entry['bytes']}")
    try:
        with safe_open(p, "pt"):  # the header only: cheap
            pass
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {ckpt} is corrupt: cannot read {entry['file']} ({e})") from None
    return p


def _member(ckpt: Path, name: str) -> Path:
    """``ckpt/name``, refused when it is not a plain name or is a symbolic link (it must resolve inside ``ckpt``)."""
    try:
        return member_path(ckpt, name, str(ckpt / MANIFEST_FILE))
    except ConfigError as e:
        raise CheckpointError(str(e)) from None


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


def restore_sharded(
    ckpt: Path, ctx: DistContext, restore: Callable[[dict[str, Tensor], Any], None], load_rows: Callable[[dict[str, Tensor]], None]
) -> dict[str, Any]:
    """Restore a checkpoint of the previous sharded format; its meta.

    ``restore(tensors, skeleton)`` takes the whole state, ``load_rows(tensors)``
    a shard's rows (each process keeps the rows it owns). One process restores
    the shards merged; each rank of a job restores shard 0 and the rows of the others.
    """
    if not ctx.is_distributed:
        tensors, meta = load_any(ckpt)
        restore(tensors, meta["state"])
        return meta
    meta = checkpoint_meta(ckpt)
    for i, shard in enumerate(iter_shards(ckpt)):
        if i == 0:
            restore(shard, meta["state"])
        else:
            load_rows(shard)
    return meta
