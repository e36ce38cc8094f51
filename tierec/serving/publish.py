"""Where an export may be written, and publishing it with one rename.

An export is written into a fresh hidden sibling of its target
(``.tmp-export-<name>-<random>``), synced, then renamed into place. The target
may be absent, an empty directory, or an earlier export (it is then replaced:
moved aside, the new one renamed in, the old one deleted); anything else is
refused, as is a target that is a symbolic link (files are created new, never
opened through a link). A crash leaves the earlier export (or nothing) in place, and
the next export removes what a crashed one left.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> tmp = begin_export(root / "ex")
>>> _ = (tmp / "manifest.json").write_text('{"format": "tierec-export"}')
>>> publish_export(tmp, root / "ex").name, sorted(p.name for p in root.iterdir())
('ex', ['ex'])
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

from tierec.train.checkpoint import fsync_dir
from tierec.serving.manifest import FORMAT_NAME, MANIFEST_FILE, ExportError


def _debris(name: str) -> re.Pattern[str]:
    return re.compile(rf"\.(tmp|trash)-export-{re.escape(name)}-[0-9a-f]{{8}}")


def is_export(path: Path) -> bool:
    """Whether ``path`` is a directory holding a tierec export manifest."""
    try:
        return json.loads((path / MANIFEST_FILE).read_text()).get("format") == FORMAT_NAME
    except (OSError, ValueError, AttributeError):
        return False


def check_target(out: Path) -> None:
    """Refuse a target that is a link, a file, or a directory that is neither empty nor an export (one line)."""
    if out.is_symlink():
        raise ExportError(f"export --out {out} is a symbolic link; tierec writes no export through a link")
    if out.exists() and not out.is_dir():
        raise ExportError(f"export --out {out} is a file; give a directory")
    if out.is_dir() and any(out.iterdir()) and not is_export(out):
        raise ExportError(f"export --out {out} is a directory that holds something other than a tierec export; "
                          "give a new or empty directory, or an earlier export to replace")  # fmt: skip


def begin_export(out: Path) -> Path:
    """Check ``out`` and create (and return) the hidden directory its export is written into."""
    out = Path(out).absolute()
    check_target(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_debris(out)
    tmp = out.parent / f".tmp-export-{out.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def publish_export(tmp: Path, out: Path) -> Path:
    """Sync ``tmp``'s files and rename it to ``out`` (an earlier export there is replaced)."""
    out = Path(out).absolute()
    check_target(out)  # again: nothing may have appeared there meanwhile
    for p in sorted(tmp.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    trash = None
    if out.exists():
        trash = out.parent / f".trash-export-{out.name}-{uuid.uuid4().hex[:8]}"
        os.replace(out, trash)
    os.replace(tmp, out)
    fsync_dir(out.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    return out


def remove_debris(out: Path) -> None:
    """Delete what crashed exports to ``out`` left (only names tierec gives its own temporary directories)."""
    pattern = _debris(out.name)
    if out.parent.is_dir():
        for p in out.parent.iterdir():
            if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
