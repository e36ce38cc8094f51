"""Readers and pruning of checkpoints agree through a lock on the checkpoint directory itself.

A reader holds a shared ``flock`` on the step directory it reads
(:func:`hold_shared`), opened without following a link. Pruning renames a
checkpoint away only when it gets the exclusive lock at once
(:func:`exclusive`, ``wait_s=0``), else leaves it to a later save; replacing
or deleting one waits for its readers (a bounded while); so a
checkpoint being read is never removed under its reader. A reader whose
choice was renamed between listing and locking gets None and picks again.
Where the file system has no ``flock`` (some network file systems), both
sides go on without it.

>>> import tempfile
>>> from pathlib import Path
>>> d = Path(tempfile.mkdtemp())
>>> held = hold_shared(d)
>>> with exclusive(d, wait_s=0) as got:
...     got
False
>>> held.close()
>>> with exclusive(d, wait_s=0) as got:
...     got
True
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkedDirError(OSError):
    """The directory is a symbolic link."""


@dataclass
class DirHold:
    """A shared lock on one directory, held until :meth:`close` (or until the object is collected)."""

    path: Path
    fd: int
    _finalizer: weakref.finalize = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._finalizer = weakref.finalize(self, os.close, self.fd)

    def close(self) -> None:
        self._finalizer()  # closing the descriptor releases the lock


def _open_dir(path: Path) -> int | None:
    """A descriptor of the directory ``path``; None if it is gone; LinkedDirError if it is a link."""
    try:
        return os.open(path, _DIR)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise LinkedDirError(errno.ELOOP, "a symbolic link", str(path)) from None
        if e.errno == errno.ENOTDIR:
            return None
        raise


def _lock(fd: int, how: int) -> bool:
    """Take ``how`` on ``fd``; False if it would block (non-blocking ``how``); True without flock support."""
    try:
        fcntl.flock(fd, how)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF):
            return True  # no flock here: go on unlocked
        raise
    return True


def _same(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def hold_shared(path: Path) -> DirHold | None:
    """A shared lock on the directory ``path``; None if it is gone or was renamed away meanwhile.

    Raises LinkedDirError if ``path`` is a symbolic link.
    """
    fd = _open_dir(path)
    if fd is None:
        return None
    try:
        _lock(fd, fcntl.LOCK_SH)  # waits while a pruner holds it (it renames, then lets go)
        if not _same(fd, path):
            os.close(fd)
            return None
    except BaseException:
        os.close(fd)
        raise
    return DirHold(Path(path), fd)


@contextmanager
def exclusive(path: Path, *, wait_s: float) -> Iterator[bool]:
    """The exclusive lock on the directory ``path`` for the block, waiting up to ``wait_s`` seconds for its
    readers; yields whether it was got. A missing directory or a link yields True: no reader holds it."""
    try:
        fd = _open_dir(path)
    except LinkedDirError:
        fd = None
    if fd is None:
        yield True
        return
    try:
        deadline = time.monotonic() + wait_s
        got = _lock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
            got = _lock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield got
    finally:
        os.close(fd)
