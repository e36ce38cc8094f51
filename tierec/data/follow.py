"""A directory that grows: its files, each taken once, in name order, when complete (``data.follow``).

:class:`FileFeed` looks at ``data.source`` (a directory) and says which files
are ready: regular files (or links to them) whose name does not start with
``.`` nor end in ``.tmp`` or ``.part`` (where a writer puts a file before it
renames it in), that are not done yet, and whose modification time is at least
``data.follow_settle_s`` seconds old (a file written in place is taken once
its writer has left it alone that long; 0 takes files at once, for writers
that rename them in). :meth:`FileFeed.wait` blocks until one is, looking every
``data.follow_poll_s`` seconds, and gives up when asked to stop. A file taken
is read whole (split ``"all"``) with the run's schema, as ``data.format``
says, or else its name's suffix; a file that grows after it was taken is not
read again.

>>> import os, tempfile, time
>>> from tierec.config import DataConfig
>>> d = tempfile.mkdtemp()
>>> for name in ("b.csv", "a.csv", ".c.csv", "d.csv.part"):
...     _ = open(os.path.join(d, name), "w").write("label,x\\n1,2\\n")
>>> feed = FileFeed(DataConfig(source=d, follow=True, follow_settle_s=0))
>>> [p.name for p in feed.ready(done={"b.csv"})], feed.wait(done={"a.csv"}, stopped=lambda: False).name
(['a.csv'], 'b.csv')
>>> feed.wait(done={"a.csv", "b.csv"}, stopped=lambda: True) is None  # nothing ready, and asked to stop
True
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path

from tierec.config import DataConfig
from tierec.data.errors import DataError
from tierec.data.source import infer_format

IN_PROGRESS = (".tmp", ".part")  # suffixes of files still being written (renamed in when complete)
_NAP_S = 0.1  # the longest sleep between two looks at a stop request


class FileFeed:
    def __init__(self, cfg: DataConfig, echo: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.directory = Path(cfg.source)
        self.echo = echo

    def ready(self, done: Collection[str]) -> list[Path]:
        """The files ready to be taken, by name, leaving out ``done`` (names)."""
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            raise DataError(f"data.source {self.directory} does not exist (data.follow trains the files of a directory)") from None
        except NotADirectoryError:
            raise DataError(f"data.source {self.directory} is a file; data.follow trains the files of a directory") from None
        now = time.time()
        out = []
        for e in entries:
            if e.name.startswith(".") or e.name.endswith(IN_PROGRESS) or e.name in done:
                continue
            try:
                if not e.is_file() or now - e.stat().st_mtime < self.cfg.follow_settle_s:
                    continue
            except FileNotFoundError:  # renamed or deleted meanwhile
                continue
            out.append(Path(e.path))
        return sorted(out, key=lambda p: p.name)

    def wait(self, done: Collection[str], stopped: Callable[[], bool], say: str = "") -> Path | None:
        """The first ready file not ``done``, waiting for one; None once ``stopped()`` says so. ``say``: a line
        printed once if there is a wait (the run's step, say)."""
        said = False
        while True:
            ready = self.ready(done)
            if ready:
                return ready[0]
            if stopped():
                return None
            if not said:
                self.echo(f"{say}waiting for new files in {self.directory} (looking every {self.cfg.follow_poll_s:g} s)")
                said = True
            end = time.monotonic() + self.cfg.follow_poll_s
            while time.monotonic() < end and not stopped():
                time.sleep(min(_NAP_S, max(end - time.monotonic(), 0.0)))

    def file_format(self, path: Path) -> str:
        """How ``path`` is read: ``data.format``, or (auto) what its suffix says; a one-line DataError otherwise."""
        fmt = self.cfg.format if self.cfg.format != "auto" else infer_format(str(path))
        if fmt in ("shards", "synthetic"):
            raise DataError(f"{path}: a directory in data.source {self.directory}; data.follow takes files only")
        suffix = path.suffix.lower()
        if (suffix in (".parquet", ".pq")) != (fmt == "parquet"):
            raise DataError(f"{path} is not a {fmt} file (its name says otherwise) and data.format = {fmt!r} for this "
                            f"run; keep one format in {self.directory}")  # fmt: skip
        return fmt

    def file_config(self, path: Path, fmt: str) -> DataConfig:
        """The data config that reads every row of ``path`` (split "all") as the run's schema says."""
        return dataclasses.replace(self.cfg, source=str(path), format=fmt, follow=False, test_source="")
