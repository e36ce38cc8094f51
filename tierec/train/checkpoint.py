"""Checkpoints: a directory of safetensors files plus JSON, published atomically, streamed.

On disk, a run directory holds::

    run_dir/
      step_00001000/
        tensors.safetensors         # rank 0's non-row state: dense model, optimizer, RNG, counters
        tensors-00001.safetensors   # rank 1's (a checkpoint saved on several processes)
        rows-00000-000000.safetensors  # rank 0's first chunk of row records (ids, weights, optimizer
        rows-00000-000001.safetensors  #   state), its table's label in the file header; ~16 MiB each
        meta.json                   # the caller's JSON meta + "step" + every file's size, world size
      step_00002000/
      latest                        # one line: the name of the newest checkpoint

Embedding tables are streamed: a storage yields its rows a bounded chunk at a
time (tier by tier: the fast tier, host, disk), each chunk goes to its own
file, and loading reads one file at a time, so neither side ever holds a whole
table (a table larger than RAM can be saved and loaded). Rows are keyed by id,
so any number of processes can load any checkpoint: each keeps the rows it owns.
All files are plain files in the checkpoint directory.

A checkpoint is written into a hidden sibling (``.tmp-...``), its files and the
directory are fsynced, then it is renamed into place, and only then is
``latest`` replaced (write a temporary file, ``os.replace``). A crash at any
point leaves the previous checkpoint and ``latest`` intact. One process
publishes (rank 0).

Reading refuses links: a step directory, or a file in it, that is a symbolic
link is a one-line CheckpointError (every member must resolve inside its
checkpoint directory). A reader holds a shared lock on the checkpoint it reads
(:mod:`tierec.train.readlock`): pruning skips a checkpoint being read (a later
save prunes it), and a reader that picked a run's latest checkpoint just as it
was pruned picks the newest again, so a complete checkpoint is never reported
broken because a running training moved it.

Nested state (a module or optimizer ``state_dict``, RNG states) becomes the flat
tensor dict plus a JSON "skeleton" with ``flatten_state`` and comes back with
``unflatten_state``:

>>> import tempfile, torch
>>> from pathlib import Path
>>> from tierec.train.checkpoint import (capture_rng_state, flatten_state, load_checkpoint,
...     restore_rng_state, save_checkpoint, unflatten_state)
>>> model = torch.nn.Linear(3, 1)
>>> opt = torch.optim.Adam(model.parameters())
>>> state = {"model": model.state_dict(), "optim": opt.state_dict(), "rng": capture_rng_state()}
>>> tensors, skeleton = flatten_state(state)
>>> run = Path(tempfile.mkdtemp())
>>> save_checkpoint(run, 10, tensors, {"epoch": 0, "state": skeleton}).name
'step_00000010'
>>> tensors, meta = load_checkpoint(run)  # the run's latest checkpoint
>>> meta["step"], sorted(tensors)[:2]
(10, ['model.bias', 'model.weight'])
>>> restored = unflatten_state(tensors, meta["state"])
>>> model.load_state_dict(restored["model"]); opt.load_state_dict(restored["optim"])
<All keys matched successfully>
>>> restore_rng_state(restored["rng"])
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from tierec.errors import ConfigError, naming_disk_full
from tierec.paths import member_path, quote
from tierec.train.integrity import verify_checksums, write_checksums
from tierec.train.readlock import DirHold, LinkedDirError, exclusive, hold_shared

if TYPE_CHECKING:
    from tierec.distributed.context import DistContext

TENSORS_FILE = "tensors.safetensors"  # rank 0's non-row state (dense model, optimizer, RNG, embedding meta)
META_FILE = "meta.json"
LATEST_FILE = "latest"
FORMAT_VERSION = 2  # 2: rows in chunk files; 1: every tensor in TENSORS_FILE (still read)
CHUNK_BYTES = 1 << 24  # bytes of row records per chunk file, about (the RAM a save or load holds for rows)
STEP_DIR = re.compile(r"step_(\d{8,})")
DELTA_DIR = re.compile(r"delta_(\d{8,})_of_(\d{8,})")  # a delta checkpoint: its step, its base's (tierec/train/delta.py)
# Left by a crashed save and removed by the next one: only names tierec gives its own temporary entries.
_DEBRIS = re.compile(r"\.(tmp|trash)-(step_\d{8,}|delta_\d{8,}_of_\d{8,}|latest)(-[0-9a-f]{8}|-sharded)?")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # what meta.json may list: files inside the checkpoint
_OWN_FILES = ("meta.json", "manifest.json", "checksums.json")  # a step directory holding none is not ours
_ROWS_FILE = re.compile(r"rows-(\d{5})-(\d{6})\.safetensors")
_PICKS = 5  # times a reader picks a run's newest checkpoint again when a running training pruned its pick
_WAIT_S = 60.0  # how long replacing or deleting a checkpoint waits for its readers


class CheckpointError(RuntimeError):
    """A missing, corrupt or unreadable checkpoint, reported as one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


# ------------------------------------------------------------------ directory format


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def state_file(rank: int) -> str:
    """The file of one rank's non-row tensors (rank 0: ``tensors.safetensors``)."""
    return TENSORS_FILE if rank == 0 else f"tensors-{rank:05d}.safetensors"


def rows_file(rank: int, seq: int) -> str:
    """The ``seq``-th chunk of row records written by ``rank``."""
    return f"rows-{rank:05d}-{seq:06d}.safetensors"


RowChunks = Iterable[tuple[str, Mapping[str, Tensor]]]  # (label, records) e.g. ("emb/C1", {"ids": ..., ...})


def write_part(tmp: Path, rank: int, tensors: Mapping[str, Tensor], rows: RowChunks = ()) -> list[str]:
    """Write one rank's part of a checkpoint into the unpublished directory ``tmp``; returns its file names.

    ``tensors`` (small: dense state, counters) go to one file; every item of
    ``rows`` to its own file, with its label in the file's header, so a table
    is never held in RAM beyond one chunk on either side of the disk.
    """
    names = [state_file(rank)]
    write_tensors(tmp / names[0], prepare_tensors(tensors))
    for seq, (label, chunk) in enumerate(rows):
        names.append(rows_file(rank, seq))
        write_tensors(tmp / names[-1], prepare_tensors(chunk), {"label": label})
    return names


def write_tensors(path: Path, tensors: Mapping[str, Tensor], metadata: dict[str, str] | None = None) -> None:
    """One safetensors file, synced; a full disk is a DiskFullError naming the file and its bytes."""
    needed = sum(t.numel() * t.element_size() for t in tensors.values())
    with naming_disk_full(path, needed, "the checkpoint file"):
        if metadata is None:
            save_file(tensors, path)
        else:
            save_file(tensors, path, metadata=metadata)
        fsync_file(path)


def begin_checkpoint(run_dir: Path, step: int, tag: str | None = None, name: str | None = None) -> Path:
    """Create (and return) the hidden directory checkpoint ``step`` (or directory ``name``) is written into."""
    run_dir.mkdir(parents=True, exist_ok=True)
    remove_debris(run_dir)
    tmp = run_dir / f".tmp-{name or checkpoint_name(step)}-{tag or uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def commit_checkpoint(run_dir: Path, tmp: Path, step: int, meta: Mapping[str, Any], world_size: int, keep: int | None) -> Path:
    """Publish ``tmp`` as checkpoint ``step``: meta.json (every file's size), rename, ``latest``, prune."""
    final = publish_dir(run_dir, tmp, checkpoint_name(step), checkpoint_record(tmp, step, meta, world_size))

    # Only now move `latest`.
    write_atomically(run_dir / LATEST_FILE, final.name + "\n")

    # Prune old checkpoints, never the one just written.
    if keep is not None:
        for old in step_dirs(run_dir)[:-keep]:
            if old.name != final.name:
                with exclusive(old, wait_s=0) as unread:
                    if unread:  # one being read (`tierec eval` meanwhile) is pruned by a later save
                        trash = run_dir / f".trash-{old.name}-{uuid.uuid4().hex[:8]}"
                        os.replace(old, trash)  # a half-deleted directory must never look like a checkpoint
        prune_deltas(run_dir)
    remove_debris(run_dir)
    return final


def checkpoint_record(tmp: Path, step: int, meta: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    """What meta.json of the unpublished directory ``tmp`` holds: ``meta``, the step, every file's size."""
    files = sorted(p.name for p in tmp.iterdir() if p.is_file())
    record = {**meta, "step": step}
    record["_checkpoint"] = {
        "format": FORMAT_VERSION,
        "world_size": world_size,
        "files": {f: (tmp / f).stat().st_size for f in files},
        "tensors_bytes": (tmp / TENSORS_FILE).stat().st_size,
    }
    return record


def publish_dir(run_dir: Path, tmp: Path, name: str, record: Mapping[str, Any]) -> Path:
    """Write ``record`` as meta.json and the checksums into ``tmp``, then rename it to ``run_dir/name`` in
    one step (an older directory of that name is moved aside first, once its readers are done)."""
    write_durably(tmp / META_FILE, json.dumps(record, indent=1))
    write_checksums(tmp)  # last: size and sha256 of every file, verified on load (tierec/train/integrity.py)
    fsync_dir(tmp)
    final = run_dir / name
    if os.path.lexists(final):
        with exclusive(final, wait_s=_WAIT_S):  # its readers finish first
            os.replace(final, run_dir / f".trash-{final.name}-{uuid.uuid4().hex[:8]}")
    os.replace(tmp, final)
    fsync_dir(run_dir)
    return final


def delta_dirs(run_dir: Path) -> list[tuple[int, int, Path]]:
    """(step, base step, directory) of a run's delta checkpoints, by step (links are none)."""
    found = [
        (int(m.group(1)), int(m.group(2)), p)
        for p in run_dir.iterdir()
        if (m := DELTA_DIR.fullmatch(p.name)) and p.is_dir() and not p.is_symlink()
    ]
    return sorted(found)


def prune_deltas(run_dir: Path) -> None:
    """Move aside the deltas whose full checkpoint is gone (one being read is left to a later save)."""
    bases = {p.name for p in step_dirs(run_dir)}
    for _step, base, path in delta_dirs(run_dir):
        if checkpoint_name(base) not in bases:
            with exclusive(path, wait_s=0) as unread:
                if unread:
                    os.replace(path, run_dir / f".trash-{path.name}-{uuid.uuid4().hex[:8]}")


def check_meta(step: int, keep: int | None, meta: Mapping[str, Any]) -> None:
    """Fail before touching the disk: a negative step, a bad ``keep``, meta that is not JSON."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 or None, got {keep}")
    if "_checkpoint" in meta or meta.get("step", step) != step:
        raise ValueError("meta must not contain '_checkpoint', nor a 'step' other than the step saved")
    try:
        json.dumps({**meta, "step": step})
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint meta is not JSON-serialisable: {e}") from None


def save_checkpoint(
    run_dir: Path | str,
    step: int,
    tensors: Mapping[str, Tensor],
    meta: Mapping[str, Any],
    keep: int | None = 2,
    rows: RowChunks = (),
    ctx: DistContext | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically, point ``latest`` at it, prune old ones.

    ``meta`` must be JSON-serialisable; ``"step"`` is added to it. ``rows``
    streams ``(label, records)`` chunks, each written to its own file as it
    comes. Pruning keeps the ``keep`` highest-numbered checkpoints and always
    the one just written (``keep=None`` keeps all). Returns the checkpoint directory.

    With ``ctx`` of several processes it is a collective: every rank passes its
    own non-row tensors and row chunks and writes them into the hidden directory
    (which must be on a file system every rank sees); rank 0's ``meta`` is kept,
    rank 0 publishes, and every rank returns once the checkpoint is published.
    """
    check_meta(step, keep, meta)
    run_dir = Path(run_dir)
    if ctx is None or not ctx.is_distributed:
        tmp = begin_checkpoint(run_dir, step)
        try:
            write_part(tmp, 0, tensors, rows)
            return commit_checkpoint(run_dir, tmp, step, meta, 1, keep)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # unpublished: gone at once (frees a full disk), `latest` unchanged
            raise
    tmp = run_dir / f".tmp-{checkpoint_name(step)}-sharded"
    if ctx.is_main:
        begin_checkpoint(run_dir, step, tag="sharded")
    ctx.barrier()
    write_part(tmp, ctx.rank, tensors, rows)  # 1. every rank writes its part, a chunk at a time
    ctx.barrier()
    if ctx.is_main:  # 2. rank 0 publishes: meta.json, rename, then `latest`, then prunes
        commit_checkpoint(run_dir, tmp, step, meta, ctx.world_size, keep)
    ctx.barrier()
    return run_dir / checkpoint_name(step)


def latest_checkpoint(run_dir: Path | str) -> Path | None:
    """The checkpoint ``latest`` names; None when the run has no checkpoint.

    If ``latest`` is absent or names a missing directory (a crash in a narrow
    window), the highest-numbered checkpoint directory is used instead.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    pointer = run_dir / LATEST_FILE
    name = None
    for _ in range(2):  # read again: a running training may have just published a newer one and pruned this
        if not pointer.is_file():
            break
        name = pointer.read_text().strip()
        if not STEP_DIR.fullmatch(name):
            raise CheckpointError(f"{pointer} holds {name[:80]!r}, which is not a checkpoint name")
        if (run_dir / name).is_dir():
            return run_dir / name
    steps = step_dirs(run_dir)
    if name is not None:
        if not steps:
            raise CheckpointError(f"{pointer} names {name}, which does not exist, and no other checkpoint does")
        warnings.warn(f"{pointer} names missing {name}; using {steps[-1].name}", stacklevel=2)
    return steps[-1] if steps else None


def find_checkpoint(path_or_run_dir: Path | str) -> Path:
    """The checkpoint directory meant by a step directory or a run directory (its latest)."""
    path = Path(path_or_run_dir)
    if STEP_DIR.fullmatch(path.name) or (path / META_FILE).exists():
        if not path.is_dir():
            raise CheckpointError(f"checkpoint {path} does not exist")
        return path
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}: it does not exist")
    found = latest_checkpoint(path)
    if found is None:
        raise CheckpointError(f"no checkpoint in {path}")
    return found


def linked(ckpt: Path) -> CheckpointError:
    """The error for a checkpoint directory that is a symbolic link."""
    return CheckpointError(f"checkpoint {ckpt} is a symbolic link; tierec reads a checkpoint only where it was "
                           "written, not through a link")


def hold_checkpoint(path_or_run_dir: Path | str) -> tuple[Path, DirHold]:
    """The checkpoint meant by ``path_or_run_dir`` and a shared lock on it (pruning leaves it alone until
    released). A run's newest is picked again if a running training pruned the first pick meanwhile."""
    for _ in range(_PICKS):
        ckpt = find_checkpoint(path_or_run_dir)
        try:
            hold = hold_shared(ckpt)
        except LinkedDirError:
            raise linked(ckpt) from None
        if hold is not None:
            return ckpt, hold
        if ckpt == Path(path_or_run_dir):
            break  # named by the caller: nothing to pick again
    raise CheckpointError(f"checkpoint {ckpt} was removed while it was being opened (pruned by the training that "
                          "writes there?); try again")


class Checkpoint:
    """A published checkpoint, read a file at a time.

    ``meta`` is the caller's meta (with ``step``); ``state(rank)`` a rank's
    non-row tensors; ``rows()`` yields ``(label, records)`` from every chunk
    file of every rank, one file in RAM at a time. It holds a shared lock on
    the directory until :meth:`close` (or the end of a ``with`` block).

    A checkpoint whose ``meta.json`` lists its files (format 2) must have a
    ``checksums.json`` that covers every one of them and ``meta.json``: a
    missing record, or one that leaves a file out, is corruption (deleting it
    cannot switch the check off).
    """

    def __init__(self, path_or_run_dir: Path | str) -> None:
        ckpt, self._hold = hold_checkpoint(path_or_run_dir)
        try:
            self._open(ckpt)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Let go of the directory (pruning may then remove it)."""
        self._hold.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self, ckpt: Path) -> None:
        try:
            record = json.loads(self._member(ckpt, META_FILE).read_text())
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {ckpt} is incomplete: {META_FILE} is missing") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise CheckpointError(f"checkpoint {ckpt} is corrupt: {META_FILE} is not valid JSON ({e})") from None
        info = record.pop("_checkpoint", None) if isinstance(record, dict) else None
        if not isinstance(info, dict) or "tensors_bytes" not in info:
            raise CheckpointError(f"{ckpt / META_FILE} is not a tierec checkpoint record")
        if info.get("format", 0) > FORMAT_VERSION:
            raise CheckpointError(f"checkpoint {ckpt} has format {info['format']}; this tierec reads {FORMAT_VERSION}")
        self.path = ckpt
        self.format = int(info.get("format", 1))
        self.meta: dict[str, Any] = record
        self.world_size = int(info.get("world_size", 1))
        self.files: dict[str, int] = info.get("files", {TENSORS_FILE: info["tensors_bytes"]})
        bad = [f for f in self.files if not (isinstance(f, str) and _PLAIN_NAME.fullmatch(f))]
        if bad:
            raise CheckpointError(f"{ckpt / META_FILE} names {quote(bad[0])}: only plain file names inside the checkpoint")
        self.row_files = sorted(f for f in self.files if _ROWS_FILE.fullmatch(f))
        required = {*self.files, META_FILE} if "files" in info else None  # format 1: no list, checked if recorded
        problem = verify_checksums(ckpt, required)
        if problem is not None:
            raise CheckpointError(f"checkpoint {ckpt} is corrupt: {problem}")

    @staticmethod
    def _member(ckpt: Path, name: str) -> Path:
        """``ckpt/name``, refused when it is a symbolic link (it must resolve inside the checkpoint)."""
        try:
            return member_path(ckpt, name, f"checkpoint {ckpt}")
        except ConfigError as e:
            raise CheckpointError(str(e)) from None

    def state(self, rank: int = 0) -> dict[str, Tensor]:
        """Rank ``rank``'s non-row tensors (rank 0's hold the dense model, optimizer and RNG)."""
        return self._read(state_file(rank))[0]

    def rows(self) -> Iterator[tuple[str, dict[str, Tensor]]]:
        """``(label, records)`` of every chunk, ranks in order."""
        for name in self.row_files:
            tensors, header = self._read(name)
            yield header.get("label", ""), tensors

    def materialise(self) -> dict[str, Tensor]:
        """Everything as one flat dict, rows as ``{label}.{key}`` concatenated over chunks (small checkpoints)."""
        out = self.state(0)
        parts: dict[str, list[Tensor]] = {}
        for label, chunk in self.rows():
            for k, v in chunk.items():
                parts.setdefault(f"{label}.{k}", []).append(v)
        out.update({k: torch.cat(v) for k, v in parts.items()})
        return out

    def _read(self, name: str) -> tuple[dict[str, Tensor], dict[str, str]]:
        path = self._member(self.path, name)
        if name not in self.files:
            raise CheckpointError(f"checkpoint {self.path} has no {name} (it was saved on {self.world_size} ranks)")
        if not path.is_file():
            raise CheckpointError(f"checkpoint {self.path} is incomplete: {name} is missing")
        size = path.stat().st_size
        if size != self.files[name]:
            raise CheckpointError(f"checkpoint {self.path} is corrupt: {name} has {size} bytes, expected {self.files[name]}")
        try:
            with safe_open(path, framework="pt") as f:
                header = f.metadata() or {}
                return {k: f.get_tensor(k) for k in f.keys()}, header
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint {self.path} is corrupt: cannot read {name} ({e})") from None


def load_checkpoint(path_or_run_dir: Path | str, device: torch.device | str = "cpu") -> tuple[dict[str, Tensor], dict]:
    """Load ``(tensors, meta)`` of a checkpoint directory, or of a run directory's latest, all in RAM.

    Row chunks come back concatenated under ``{label}.{key}``. Raises
    CheckpointError (one line) if there is no checkpoint or it is corrupt. To
    load a table larger than RAM, read :class:`Checkpoint` chunk by chunk.
    """
    with Checkpoint(path_or_run_dir) as ckpt:
        tensors = ckpt.materialise()
    if str(device) != "cpu":
        tensors = {k: v.to(device) for k, v in tensors.items()}
    return tensors, ckpt.meta


def checkpoint_dirs(run_dir: Path | str) -> list[Path]:
    """A run's checkpoint directories, newest first (``latest``'s first), to try in turn on resume."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    steps = step_dirs(run_dir)[::-1]
    try:
        newest = latest_checkpoint(run_dir)
    except CheckpointError:
        newest = None
    return ([newest] if newest is not None else []) + [p for p in steps if p != newest]


def remove_checkpoints(run_dir: Path | str) -> None:
    """Delete a run's checkpoints: tierec's own step directories, ``latest`` and debris, nothing else."""
    run_dir = Path(run_dir)
    for old in step_dirs(run_dir) + [p for _s, _b, p in delta_dirs(run_dir)]:
        trash = run_dir / f".trash-{old.name}-{uuid.uuid4().hex[:8]}"
        with exclusive(old, wait_s=_WAIT_S):  # its readers finish first
            os.replace(old, trash)
    (run_dir / LATEST_FILE).unlink(missing_ok=True)
    remove_debris(run_dir)
    try:
        run_dir.rmdir()
    except OSError:
        pass  # something not ours is left in it


def step_dirs(run_dir: Path) -> list[Path]:
    """Checkpoint directories of a run, oldest step first (a symbolic link is none: tierec never makes one)."""
    found = [
        (int(m.group(1)), p)
        for p in run_dir.iterdir()
        if (m := STEP_DIR.fullmatch(p.name)) and p.is_dir() and not p.is_symlink()
        and any((p / f).is_file() for f in _OWN_FILES)
    ]
    return [p for _, p in sorted(found)]


def prepare_tensors(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Detached, CPU, contiguous tensors, none sharing storage (safetensors refuses aliasing)."""
    out: dict[str, Tensor] = {}
    storages: set[int] = set()
    for name, t in tensors.items():
        if not isinstance(name, str) or not isinstance(t, Tensor):
            kinds = f"{type(name).__name__} -> {type(t).__name__}"
            raise TypeError(f"checkpoint tensors must map str -> Tensor; got {kinds}")
        if t.layout != torch.strided:
            raise ValueError(f"tensor {name!r} has layout {t.layout}; only dense tensors can be saved")
        t = t.detach().cpu().contiguous()
        if t.numel() > 0:
            ptr = t.untyped_storage().data_ptr()
            if ptr in storages:
                t = t.clone()
            storages.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def remove_debris(run_dir: Path) -> None:
    for p in run_dir.iterdir():
        if _DEBRIS.fullmatch(p.name):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or new entry in ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_durably(path: Path, text: str) -> None:
    with naming_disk_full(path, len(text.encode()), "the checkpoint file"), open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex[:8]}")
    write_durably(tmp, text)
    os.replace(tmp, path)
    fsync_dir(path.parent)


# ----------------------------------------------------- nested state <-> flat tensors

# JSON tags for what JSON cannot say directly; a dict using one as a key is stored as items.
_TENSOR, _TUPLE, _ITEMS, _NDARRAY = "__tensor__", "__tuple__", "__items__", "__ndarray__"
_TAGS = frozenset({_TENSOR, _TUPLE, _ITEMS, _NDARRAY})


def flatten_state(state: Any, prefix: str = "") -> tuple[dict[str, Tensor], Any]:
    """Split nested state into a flat ``{name: Tensor}`` dict and a JSON skeleton.

    ``state`` may nest dicts (any keys), lists, tuples, tensors, numpy arrays and
    JSON scalars, as module and optimizer ``state_dict``s and RNG states do.
    Tensor names are the dotted key path under ``prefix``, e.g.
    ``optim.state.0.exp_avg``. ``unflatten_state`` inverts it exactly (tuples stay
    tuples, int keys stay ints).
    """
    tensors: dict[str, Tensor] = {}

    def join(path: str, key: Any) -> str:
        return f"{path}.{key}" if path else str(key)

    def encode(x: Any, path: str) -> Any:
        if isinstance(x, Tensor):
            if path in tensors:
                raise ValueError(f"two tensors in the state would both be named {path!r}")
            tensors[path] = x
            return {_TENSOR: path}
        if isinstance(x, np.ndarray):
            return {_NDARRAY: x.tolist(), "dtype": str(x.dtype)}
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, tuple):
            return {_TUPLE: [encode(v, join(path, i)) for i, v in enumerate(x)]}
        if isinstance(x, list):
            return [encode(v, join(path, i)) for i, v in enumerate(x)]
        if isinstance(x, Mapping):
            if all(isinstance(k, str) for k in x) and not _TAGS.intersection(x):
                return {k: encode(v, join(path, k)) for k, v in x.items()}
            items = enumerate(x.items())
            return {_ITEMS: [[encode(k, join(path, f"key{i}")), encode(v, join(path, k))] for i, (k, v) in items]}
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise TypeError(f"cannot checkpoint a {type(x).__name__} at {path or '<root>'!r}")

    skeleton = encode(state, prefix)
    return tensors, skeleton


def unflatten_state(tensors: Mapping[str, Tensor], skeleton: Any) -> Any:
    """Rebuild the nested state ``flatten_state`` split; tensors are taken from ``tensors``."""

    def decode(x: Any) -> Any:
        if isinstance(x, list):
            return [decode(v) for v in x]
        if not isinstance(x, dict):
            return x
        if _TENSOR in x:
            name = x[_TENSOR]
            if name not in tensors:
                raise CheckpointError(f"checkpoint lacks tensor {name!r}")
            return tensors[name]
        if _TUPLE in x:
            return tuple(decode(v) for v in x[_TUPLE])
        if _NDARRAY in x:
            return np.array(x[_NDARRAY], dtype=x["dtype"])
        if _ITEMS in x:
            return {decode(k): decode(v) for k, v in x[_ITEMS]}
        return {k: decode(v) for k, v in x.items()}

    return decode(skeleton)


# ------------------------------------------------------------------------ RNG state


def capture_rng_state(generators: Mapping[str, torch.Generator | np.random.Generator] | None = None) -> dict[str, Any]:
    """Python, numpy-global, torch (and CUDA, if present) RNG states plus named generators.

    Pass the result through ``flatten_state``: torch states are uint8 tensors,
    the others become JSON.
    """
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(legacy=False),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    named: dict[str, Any] = {}
    for name, g in (generators or {}).items():
        named[name] = g.get_state() if isinstance(g, torch.Generator) else g.bit_generator.state
    state["generators"] = named
    return state


def restore_rng_state(
    state: Mapping[str, Any], generators: Mapping[str, torch.Generator | np.random.Generator] | None = None
) -> None:
    """Put back what ``capture_rng_state`` took; ``generators`` are restored in place by name."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    saved = state.get("generators", {})
    for name, g in (generators or {}).items():
        if name not in saved:
            raise CheckpointError(f"checkpoint has no state for RNG generator {name!r}; it has {sorted(saved)}")
        if isinstance(g, torch.Generator):
            g.set_state(saved[name])
        else:
            g.bit_generator.state = saved[name]
