"""Checkpoints: a directory of flat tensors plus JSON, published atomically.

On disk, a run directory holds::

    run_dir/
      step_00001000/
        tensors.safetensors   # flat {name: Tensor}; no pickle anywhere
        meta.json             # the caller's JSON meta + "step" + format info
      step_00002000/
      latest                  # one line: the name of the newest checkpoint

A checkpoint is written into a hidden sibling (``.tmp-...``), its files and the
directory are fsynced, then it is renamed into place, and only then is
``latest`` replaced (write a temporary file, ``os.replace``). A crash at any
point leaves the previous checkpoint and ``latest`` intact. One process writes
to a run directory (rank 0, or one run directory per rank).

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

TENSORS_FILE = "tensors.safetensors"
META_FILE = "meta.json"
LATEST_FILE = "latest"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"step_(\d{8,})")
# Left by a crashed save and removed by the next one: only names tierec gives its own temporary entries.
_DEBRIS = re.compile(r"\.(tmp|trash)-(step_\d{8,}|latest)(-[0-9a-f]{8}|-sharded)?")
_OWN_FILES = ("meta.json", "manifest.json", "checksums.json")  # a step directory holding none is not ours


class CheckpointError(RuntimeError):
    """A missing, corrupt or unreadable checkpoint, reported as one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


# ------------------------------------------------------------------ directory format


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def save_checkpoint(
    run_dir: Path | str, step: int, tensors: Mapping[str, Tensor], meta: Mapping[str, Any], keep: int | None = 2
) -> Path:
    """Write checkpoint ``step`` atomically, point ``latest`` at it, prune old ones.

    ``meta`` must be JSON-serialisable; ``"step"`` is added to it. Pruning keeps
    the ``keep`` highest-numbered checkpoints and always the one just written
    (``keep=None`` keeps all). Returns the checkpoint directory.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 or None, got {keep}")
    if "_checkpoint" in meta or meta.get("step", step) != step:
        raise ValueError("meta must not contain '_checkpoint', nor a 'step' other than the step saved")
    record = {**meta, "step": step}
    try:
        json.dumps(record)  # fail before touching the disk
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint meta is not JSON-serialisable: {e}") from None
    flat = _prepare_tensors(tensors)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    _remove_debris(run_dir)
    final = run_dir / checkpoint_name(step)

    # 1. Write everything into a hidden sibling and make it durable.
    tmp = run_dir / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    save_file(flat, tmp / TENSORS_FILE)
    _fsync_file(tmp / TENSORS_FILE)
    record["_checkpoint"] = {"format": FORMAT_VERSION, "tensors_bytes": (tmp / TENSORS_FILE).stat().st_size}
    _write_durably(tmp / META_FILE, json.dumps(record, indent=1))
    _fsync_dir(tmp)

    # 2. Publish with one rename (an older save of this same step is moved aside first).
    if final.exists():
        os.replace(final, run_dir / f".trash-{final.name}-{uuid.uuid4().hex[:8]}")
    os.replace(tmp, final)
    _fsync_dir(run_dir)

    # 3. Only now move `latest`.
    _write_atomically(run_dir / LATEST_FILE, final.name + "\n")

    # 4. Prune old checkpoints, never the one just written.
    if keep is not None:
        for old in _step_dirs(run_dir)[:-keep]:
            if old.name != final.name:
                trash = run_dir / f".trash-{old.name}-{uuid.uuid4().hex[:8]}"
                os.replace(old, trash)  # a half-deleted directory must never look like a checkpoint
    _remove_debris(run_dir)
    return final


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
    if pointer.is_file():
        name = pointer.read_text().strip()
        if not _STEP_DIR.fullmatch(name):
            raise CheckpointError(f"{pointer} holds {name[:80]!r}, which is not a checkpoint name")
        if (run_dir / name).is_dir():
            return run_dir / name
    steps = _step_dirs(run_dir)
    if name is not None:
        if not steps:
            raise CheckpointError(f"{pointer} names {name}, which does not exist, and no other checkpoint does")
        warnings.warn(f"{pointer} names missing {name}; using {steps[-1].name}", stacklevel=2)
    return steps[-1] if steps else None


def load_checkpoint(path_or_run_dir: Path | str, device: torch.device | str = "cpu") -> tuple[dict[str, Tensor], dict]:
    """Load ``(tensors, meta)`` from a checkpoint directory, or from a run directory's latest.

    Raises CheckpointError (one line) if there is no checkpoint or it is corrupt.
    """
    path = Path(path_or_run_dir)
    if _STEP_DIR.fullmatch(path.name) or (path / META_FILE).exists():
        ckpt = path
    else:
        if not path.exists():
            raise CheckpointError(f"no checkpoint at {path}: it does not exist")
        found = latest_checkpoint(path)
        if found is None:
            raise CheckpointError(f"no checkpoint in {path}")
        ckpt = found
    if not ckpt.is_dir():
        raise CheckpointError(f"checkpoint {ckpt} does not exist")

    try:
        record = json.loads((ckpt / META_FILE).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {ckpt} is incomplete: {META_FILE} is missing") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint {ckpt} is corrupt: {META_FILE} is not valid JSON ({e})") from None
    info = record.pop("_checkpoint", None) if isinstance(record, dict) else None
    if not isinstance(info, dict) or "tensors_bytes" not in info:
        raise CheckpointError(f"{ckpt / META_FILE} is not a tierec checkpoint record")
    if info.get("format", 0) > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {ckpt} has format {info['format']}; this tierec reads {FORMAT_VERSION}")

    tensor_path = ckpt / TENSORS_FILE
    if not tensor_path.is_file():
        raise CheckpointError(f"checkpoint {ckpt} is incomplete: {TENSORS_FILE} is missing")
    size = tensor_path.stat().st_size
    if size != info["tensors_bytes"]:
        expected = info["tensors_bytes"]
        raise CheckpointError(f"checkpoint {ckpt} is corrupt: {TENSORS_FILE} has {size} bytes, expected {expected}")
    try:
        tensors = load_file(tensor_path, device=str(device))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {ckpt} is corrupt: cannot read {TENSORS_FILE} ({e})") from None
    return tensors, record


def remove_checkpoints(run_dir: Path | str) -> None:
    """Delete a run's checkpoints: tierec's own step directories, ``latest`` and debris, nothing else."""
    run_dir = Path(run_dir)
    for old in _step_dirs(run_dir):
        trash = run_dir / f".trash-{old.name}-{uuid.uuid4().hex[:8]}"
        os.replace(old, trash)
    (run_dir / LATEST_FILE).unlink(missing_ok=True)
    _remove_debris(run_dir)
    try:
        run_dir.rmdir()
    except OSError:
        pass  # something not ours is left in it


def _step_dirs(run_dir: Path) -> list[Path]:
    """Checkpoint directories of a run, oldest step first."""
    found = [
        (int(m.group(1)), p)
        for p in run_dir.iterdir()
        if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir() and any((p / f).is_file() for f in _OWN_FILES)
    ]
    return [p for _, p in sorted(found)]


def _prepare_tensors(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
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


def _remove_debris(run_dir: Path) -> None:
    for p in run_dir.iterdir():
        if _DEBRIS.fullmatch(p.name):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
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


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex[:8]}")
    _write_durably(tmp, text)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


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
