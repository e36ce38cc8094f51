"""The one door for every file tierec writes in a run directory.

``config.toml``, ``metrics.jsonl``, ``summary.json``, the plots,
``tensorboard/`` and ``checkpoints/`` are all written through :class:`RunFiles`:

- **No link is followed.** A name that is a symbolic link, or passes through
  one, is refused, and files are opened with ``O_NOFOLLOW``: a link planted in
  a run directory never carries a write outside it.
- **Only over its own files.** The run's marker ``.tierec-run`` records every
  name tierec created in the directory (one JSON line each, appended). A name
  that exists but is not recorded is the user's: refused (one-line
  :class:`RunDirError`), never written over or deleted.
- **Whole or not at all.** A rewritten file (``config.toml``,
  ``summary.json``, a plot) is written to a hidden temporary beside it and
  renamed over it: a reader or a crash sees the old file or the new one, whole.
  ``metrics.jsonl`` is appended to (``O_APPEND``).

A marker written before names were recorded (version 1) counts the names in
``ADOPTED`` that exist as tierec's own, once: the next claim records them.

>>> import tempfile
>>> from pathlib import Path
>>> run = RunFiles(Path(tempfile.mkdtemp()))
>>> _ = (run.root / "loss_auc.png").write_bytes(b"mine")
>>> _ = run.write_text("summary.json", "{}")
>>> run.write("loss_auc.png", b"PNG")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
tierec.train.runfiles.RunDirError: .../loss_auc.png exists and tierec did not write it; ...
>>> sorted(run.own()), (run.root / "loss_auc.png").read_bytes()
(['summary.json'], b'mine')
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from tierec.errors import ConfigError

MARKER = ".tierec-run"
RECORDING = 2  # marker version from which every name tierec creates is recorded in it
# What a run directory of a marker before RECORDING may hold of tierec's (taken as its own when present).
ADOPTED = ("config.toml", "metrics.jsonl", "summary.json", "checkpoints", "checkpoints/best", "tensorboard",
           "loss_auc.png", "throughput.png", "embedding.png", "store_hit_rate.png")  # fmt: skip
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class RunDirError(ConfigError):
    """A run directory that may not be used, read or written as asked (one line, exit status 2)."""


@dataclass(frozen=True)
class RunFiles:
    """The files tierec writes in the run directory ``root`` (which may itself be a link the user chose)."""

    root: Path

    # ---------------------------------------------------------------- ownership

    def claimed(self) -> bool:
        """Whether ``root`` carries tierec's marker."""
        return self._records() is not None

    def claim(self) -> None:
        """Mark ``root`` as a run directory of tierec's; a marker of before RECORDING records what it adopts."""
        records = self._records()
        if records is None:
            try:
                self._append_marker({"tierec_run": RECORDING, "created": time.time()}, create=True)
            except FileExistsError:
                pass  # another tierec process claimed it meanwhile
        elif _version(records) < RECORDING:
            self._append_marker({"tierec_run": RECORDING, "adopted": sorted(self.own())})

    def own(self) -> set[str]:
        """The names in ``root`` that tierec wrote (recorded in the marker)."""
        records = self._records() or []
        names = {r["wrote"] for r in records if isinstance(r.get("wrote"), str)}
        names.update(n for r in records if isinstance(r.get("adopted"), list) for n in r["adopted"] if isinstance(n, str))
        if records and _version(records) < RECORDING:
            names.update(n for n in ADOPTED if os.path.lexists(self.root / n) and not self._link_on(n))
        return names

    def check(self, names: Iterable[str]) -> None:
        """Raise RunDirError if tierec may not write one of ``names`` (a link, or a file of the user's)."""
        own = self.own()
        for name in names:
            self._refuse(name, own)

    # ------------------------------------------------------------------ writing

    def write(self, name: str, data: bytes) -> Path:
        """Write ``name`` whole: into a hidden temporary, then renamed over the old one (if tierec's)."""
        path, exists = self._writable(name)
        tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex[:8]}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if exists:
                os.replace(tmp, path)  # replaces the entry itself: a link put there meanwhile is not followed
            else:
                try:
                    os.link(tmp, path)  # never over a file that appeared meanwhile
                except FileExistsError:
                    raise self._not_ours(path) from None
                self._record(name)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def write_text(self, name: str, text: str) -> Path:
        return self.write(name, text.encode("utf-8"))

    def append(self, name: str) -> TextIO:
        """``name`` opened for appending (created if missing); the caller closes it."""
        path, exists = self._writable(name)
        flags = os.O_WRONLY | os.O_APPEND | _NOFOLLOW | (0 if exists else os.O_CREAT | os.O_EXCL)
        try:
            fd = os.open(path, flags, 0o644)
        except FileExistsError:
            raise self._not_ours(path) from None
        except OSError:
            if os.path.islink(path):  # made a link since it was checked
                raise self._link_error(path) from None
            raise
        if not exists:
            self._record(name)
        return os.fdopen(fd, "a", encoding="utf-8")

    def directory(self, name: str) -> Path:
        """The directory ``name`` of tierec's (created if missing); never a link."""
        path, exists = self._writable(name)
        if not exists:
            try:
                path.mkdir()
            except FileExistsError:
                raise self._not_ours(path) from None
            self._record(name)
        elif not path.is_dir():
            raise RunDirError(f"{path} is not a directory; tierec needs that name for its own directory")
        return path

    def remove(self, name: str) -> None:
        """Delete the file ``name`` if tierec wrote it (a link or a file of the user's stays)."""
        path = self.root / name
        if name in self.own() and path.is_file() and not self._link_on(name):
            path.unlink()

    # ------------------------------------------------------------------ helpers

    def _writable(self, name: str) -> tuple[Path, bool]:
        self.claim()
        self._refuse(name, self.own())
        path = self.root / name
        return path, os.path.lexists(path)

    def _refuse(self, name: str, own: set[str]) -> None:
        path = self.root / name
        link = self._link_on(name)
        if link is not None:
            raise self._link_error(link)
        if os.path.lexists(path) and name not in own:
            raise self._not_ours(path)

    def _link_on(self, name: str) -> Path | None:
        """The first component of ``name`` (under ``root``) that is a symbolic link, or None."""
        path = self.root
        for part in name.split("/"):
            path = path / part
            if path.is_symlink():
                return path
        return None

    @staticmethod
    def _link_error(path: Path) -> RunDirError:
        return RunDirError(f"{path} is a symbolic link; tierec writes nothing through a link: "
                           "remove it, or choose another --run-dir")

    @staticmethod
    def _not_ours(path: Path) -> RunDirError:
        return RunDirError(f"{path} exists and tierec did not write it; tierec writes nothing over a file of yours: "
                           "move it away, or choose another --run-dir")

    def _records(self) -> list[dict[str, Any]] | None:
        """The marker's JSON lines (a torn last line is skipped); None when there is no marker."""
        path = self.root / MARKER
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError:
            if path.is_symlink():
                raise self._link_error(path) from None
            raise
        with os.fdopen(fd, "rb") as f:
            lines = f.read().splitlines()
        records = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def _record(self, name: str) -> None:
        if name not in self.own():
            self._append_marker({"wrote": name})

    def _append_marker(self, record: dict[str, Any], create: bool = False) -> None:
        flags = os.O_WRONLY | os.O_APPEND | _NOFOLLOW | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.root / MARKER, flags, 0o644)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")  # one short write: appends of two processes do not interleave


def _version(records: list[dict[str, Any]]) -> int:
    return max((int(r["tierec_run"]) for r in records if isinstance(r.get("tierec_run"), int)), default=1)
