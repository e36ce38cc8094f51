"""Checkpoint integrity, as a layer over whatever files a checkpoint directory holds.

When a checkpoint directory is complete, and before it is published,
``write_checksums`` records the size and SHA-256 of every file in it (any
layout: one tensor file, one shard per rank, chunk files in subdirectories) in
``checksums.json``. ``verify_checksums`` recomputes them on load and names the
first file whose bytes changed or were cut short (or that is a symbolic link);
given the files a checkpoint must hold, a missing ``checksums.json`` or one
that leaves one of them out is itself a problem, so a resume can fall back to
an older intact checkpoint instead of training on flipped bits. Hashing streams
the files in 4 MiB pieces (SHA-256 runs at about 1-2 GB/s with the CPU's SHA
instructions), so it needs no memory beyond that.

``validate_tensors`` checks loaded values: floating tensors finite, ids
(``*.ids``) non-negative and unique, one weight row per id.

>>> import tempfile
>>> from pathlib import Path
>>> d = Path(tempfile.mkdtemp())
>>> _ = (d / "a.bin").write_bytes(b"1234")
>>> write_checksums(d)
>>> verify_checksums(d) is None
True
>>> _ = (d / "a.bin").write_bytes(b"1235")
>>> verify_checksums(d)
'a.bin does not match its checksum (its bytes changed after it was written)'
>>> verify_checksums(d, required={"a.bin", "b.bin"})
'checksums.json does not cover b.bin (it must cover every file of the checkpoint)'
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path

import torch
from torch import Tensor

from tierec.errors import naming_disk_full

CHECKSUMS_FILE = "checksums.json"
ALGORITHM = "sha256"
_PIECE = 4 << 20  # bytes hashed at a time


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(_PIECE):
            h.update(piece)
    return h.hexdigest()


def _files(ckpt: Path) -> list[str]:
    out = []
    for root, _dirs, names in os.walk(ckpt):
        for n in names:
            rel = (Path(root) / n).relative_to(ckpt).as_posix()
            if rel != CHECKSUMS_FILE:
                out.append(rel)
    return sorted(out)


def write_checksums(ckpt: Path) -> None:
    """Record size and digest of every file under ``ckpt`` in ``ckpt/checksums.json`` (written durably)."""
    ckpt = Path(ckpt)
    files = {rel: {"bytes": (ckpt / rel).stat().st_size, ALGORITHM: file_digest(ckpt / rel)} for rel in _files(ckpt)}
    text = json.dumps({"algorithm": ALGORITHM, "files": files}, indent=1)
    path = ckpt / CHECKSUMS_FILE
    with naming_disk_full(path, len(text.encode()), "the checkpoint file"), open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def verify_checksums(ckpt: Path, required: Collection[str] | None = None) -> str | None:
    """None if every file ``checksums.json`` lists is whole; else what is wrong, in one line.

    ``required``: the files the record must cover (the checkpoint's own list); then a missing
    ``checksums.json`` is a problem too. Without it (a checkpoint format that lists no files), a
    checkpoint with no ``checksums.json`` passes.
    """
    from tierec.errors import ConfigError  # noqa: PLC0415 - keeps this module light
    from tierec.paths import member_path  # noqa: PLC0415

    ckpt = Path(ckpt)
    path = ckpt / CHECKSUMS_FILE
    if not os.path.lexists(path):
        return None if required is None else f"{CHECKSUMS_FILE} is missing (every checkpoint of this format has one)"
    try:
        member_path(ckpt, CHECKSUMS_FILE, str(ckpt))
    except ConfigError as e:
        return str(e)
    try:
        record = json.loads(path.read_text())
        files = record["files"]
        if record.get("algorithm") != ALGORITHM or not isinstance(files, dict):
            return f"{CHECKSUMS_FILE} is not a tierec checksum record"
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        return f"{CHECKSUMS_FILE} is unreadable ({e})"
    uncovered = sorted(set(required or ()) - set(files))
    if uncovered:
        return f"{CHECKSUMS_FILE} does not cover {uncovered[0]} (it must cover every file of the checkpoint)"
    for rel, want in sorted(files.items()):
        try:
            p = member_path(ckpt, rel, str(path))
            size, digest = int(want["bytes"]), str(want[ALGORITHM])
        except ConfigError as e:
            return str(e)
        except (ValueError, KeyError, TypeError) as e:
            return f"{CHECKSUMS_FILE} has a bad entry for {rel!r} ({e})"
        if not p.is_file():
            return f"{rel} is missing"
        have = p.stat().st_size
        if have != size:
            return f"{rel} has {have} bytes, expected {size} (truncated or padded)"
        if file_digest(p) != digest:
            return f"{rel} does not match its checksum (its bytes changed after it was written)"
    return None


def validate_tensors(tensors: Mapping[str, Tensor]) -> str | None:
    """None if loaded values are usable; else the first problem, naming the tensor."""
    for name, t in tensors.items():
        if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            return f"tensor {name} holds {bad} NaN or infinite value(s)"
        if (name == "ids" or name.endswith(".ids")) and t.numel():
            if t.dtype.is_floating_point or t.dim() != 1:
                return f"tensor {name} is not a 1-d integer tensor of ids"
            if bool((t < 0).any()):
                return f"tensor {name} holds negative ids (e.g. {int(t[t < 0][0])})"
            if torch.unique(t).numel() != t.numel():
                return f"tensor {name} holds {t.numel() - torch.unique(t).numel()} duplicate id(s)"
            rows = tensors.get(name[: -len("ids")] + "weights")
            if rows is not None and rows.shape[0] != t.numel():
                return f"tensor {name} has {t.numel()} ids but its weights have {rows.shape[0]} rows"
    return None
