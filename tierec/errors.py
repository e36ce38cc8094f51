"""Errors shared by every layer (the configuration, the store's size parser, the CLI).

A leaf module: it imports nothing of tierec, so any module may raise these
without an import cycle.

>>> from tierec.errors import ConfigError, DiskFullError, DiskTierError
>>> str(ConfigError("store.cache_size: 'x' is not a size"))
"store.cache_size: 'x' is not a size"
>>> str(DiskFullError("/data/rows", 4096, 0, what="the disk tier's rows in"))
"disk full: the disk tier's rows in /data/rows: a write of 4,096 bytes did not fit (0 bytes free there); free space there, then continue with --resume (the last complete checkpoint is intact)"
>>> str(DiskTierError("/data/tierec-x.rows", "a read of 4,096 bytes at offset 0 came back short (0 bytes)"))
'the disk tier file /data/tierec-x.rows: a read of 4,096 bytes at offset 0 came back short (0 bytes); its rows are lost; continue with --resume (the last complete checkpoint is intact)'
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager


class ConfigError(ValueError):
    """A configuration problem, reported as one line to the user."""


class DiskFullError(OSError):
    """A write did not fit on its file system: names the path, the bytes it needed and what was free (one line)."""

    RESUME = "free space there, then continue with --resume (the last complete checkpoint is intact)"

    def __init__(self, path: str, needed: int, free: int | None, *, what: str = "writing", hint: str = RESUME) -> None:
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        self.needed, self.free, self.what, self.hint = int(needed), free, what, hint

    def __str__(self) -> str:
        free = "free space unknown" if self.free is None else f"{self.free:,} bytes free there"
        return f"disk full: {self.what} {self.filename}: a write of {self.needed:,} bytes did not fit ({free}); {self.hint}"


class DiskTierError(RuntimeError):
    """The disk tier's file lost or changed rows (a short read or write, a truncated file): one line naming it.

    Its rows cannot be trusted any more, so the run stops without saving them;
    ``--resume`` continues from the last complete checkpoint.
    """

    HINT = "its rows are lost; continue with --resume (the last complete checkpoint is intact)"

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"the disk tier file {path}: {problem}; {self.HINT}")
        self.path = path


def is_disk_full(e: BaseException) -> bool:
    """True for ENOSPC from any layer (an OSError, or a library's wrapped I/O error such as safetensors')."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)
    return "No space left" in text or "code: 28," in text or "StorageFull" in text


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged write may still use on the file system of ``path`` (or of its nearest existing parent)."""
    p = os.path.abspath(os.fspath(path))
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


@contextmanager
def naming_disk_full(path: str | os.PathLike, needed: int, what: str = "writing") -> Iterator[None]:
    """Turn running out of space inside the block into a DiskFullError naming ``path`` and ``needed`` bytes."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as e:
        if not is_disk_full(e):
            raise
        raise DiskFullError(str(path), needed, free_bytes(path), what=what) from None
