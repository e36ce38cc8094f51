"""The passes a run trains: epochs over the training split, or the files of a growing directory.

The trainer's loop asks its passes for the batches of pass ``pos.epoch`` from
batch ``pos.batch_in_epoch`` on (a resumed run starts inside one), trains
them, and tells the passes when one is finished:

- :class:`EpochPasses` (the default): pass ``e`` is epoch ``e`` of the training
  split, in the order of ``(train.seed, e)``; the run ends after
  ``train.epochs`` (or ``train.max_steps``).
- :class:`FollowPasses` (``data.follow``, ``tierec train --follow``): pass ``e``
  is the ``e``-th file taken from the directory ``data.source``
  (tierec/data/follow.py), every row of it, shuffled by ``(train.seed, e)``
  when ``data.shuffle``; the run waits for the next file when there is none and
  ends on ``train.max_steps`` or a stop request (SIGTERM). The files done and
  the one being trained go into every checkpoint (``stream`` in its meta), so
  ``--resume`` goes on exactly where it was, and a file is never trained twice.

>>> from tierec.config import load_config
>>> from tierec.data import open_dataset
>>> cfg = load_config(None, ["data.synthetic.train_rows=1000", "train.batch_size=256", "train.epochs=2"])
>>> passes = EpochPasses(cfg, open_dataset(cfg.data))
>>> passes.total_steps(passes.probe()), passes.checkpoint_meta()
(8, {})
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tierec.config import Config
from tierec.data import BatchSource, DataError, Dataset, open_dataset
from tierec.data.follow import FileFeed
from tierec.data.order import Shuffle


def _shuffle(cfg: Config, epoch: int) -> Shuffle | None:
    d = cfg.data
    return Shuffle(cfg.train.seed, epoch, d.shuffle_buffer, d.shuffle_chunk_rows) if d.shuffle else None


class EpochPasses:
    """Epochs over the training split of ``data``."""

    publishes_each_pass = False  # (the deltas of train.delta_every only)

    def __init__(self, cfg: Config, data: Dataset) -> None:
        self.cfg = cfg
        self.data = data

    def probe(self) -> BatchSource:
        return self.data.source("train", self.cfg.train.batch_size)

    def total_steps(self, probe: BatchSource) -> int:
        t = self.cfg.train
        if t.max_steps:
            return t.max_steps
        if probe.num_batches is None:
            raise ValueError("the training data's length is unknown; set train.max_steps")
        return probe.num_batches * t.epochs

    def source(self, epoch: int, start_batch: int, step: int) -> BatchSource:
        return self.data.source("train", self.cfg.train.batch_size, start_batch=start_batch, shuffle=_shuffle(self.cfg, epoch),
                                epoch=epoch)

    def finished(self) -> None:
        pass

    def checkpoint_meta(self) -> dict[str, Any]:
        return {}

    def load(self, meta: dict[str, Any]) -> None:
        pass


def resolve_format(cfg: Config, stopped: Callable[[], bool], echo: Callable[[str], None]) -> Config | None:
    """``cfg`` with ``data.format`` as the directory's first file says (when "auto"), so that the run's config and
    checkpoints record how its files were read (an export needs it); None when stopped before a file came."""
    if cfg.data.format != "auto":
        return cfg
    feed = FileFeed(cfg.data, echo)
    first = feed.wait(done=(), stopped=stopped)
    if first is None:
        return None
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, format=feed.file_format(first)))


class FollowPasses:
    """The files of the directory ``data.source``, one pass each, as they arrive (``data.follow``)."""

    publishes_each_pass = True  # a file's last steps are published when it is done, not when the next one comes

    def __init__(self, cfg: Config, stopped: Callable[[], bool], echo: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.feed = FileFeed(cfg.data, echo)
        self.stopped = stopped
        self.echo = echo
        self.done: list[str] = []  # names of the files trained, in the order taken
        self.current: str | None = None  # the file being trained
        self.columns: tuple[tuple[str, ...], tuple[str, ...]] | None = None  # the run's (categorical, dense) columns

    def probe(self) -> BatchSource | None:
        """A file's batches to build the model from (the first to train, in a new run); None when stopped first."""
        path = self.feed.wait(done=(), stopped=self.stopped)
        if path is None:
            return None
        probe = self._dataset(path).source("all", self.cfg.train.batch_size)
        self.columns = (probe.feature_names, probe.dense_names)
        return probe

    def total_steps(self, probe: BatchSource | None) -> int | None:
        return self.cfg.train.max_steps or None

    def source(self, epoch: int, start_batch: int, step: int) -> BatchSource | None:
        """The batches of the file being trained (from ``start_batch``), or of the next one, waiting for it;
        None when a stop was asked for while waiting."""
        if self.current is None:
            path = self.feed.wait(self.done, self.stopped, say=f"step {step}: ")
            if path is None:
                return None
            self.current, verb = path.name, "taking"
        else:
            path, verb = self.feed.directory / self.current, f"continuing at batch {start_batch}:"
            if not path.is_file():
                raise DataError(f"{path} was being trained when the checkpoint was saved and is gone; put it back to "
                                "resume exactly, or start a new run")  # fmt: skip
        source = self._dataset(path).source("all", self.cfg.train.batch_size, start_batch=start_batch,
                                            shuffle=_shuffle(self.cfg, epoch))  # fmt: skip
        if self.columns is not None and (source.feature_names, source.dense_names) != self.columns:
            raise DataError(f"{path} has the columns {list(source.dense_names) + list(source.feature_names)}, the run "
                            f"{list(self.columns[1]) + list(self.columns[0])}; every file of data.source needs the run's")  # fmt: skip
        rows = f"{source.num_rows:,} rows" if source.num_rows is not None else "rows"
        self.echo(f"step {step}: {verb} {path.name} ({rows})")
        return source

    def finished(self) -> None:
        if self.current is not None:
            self.done.append(self.current)
        self.current = None

    def checkpoint_meta(self) -> dict[str, Any]:
        return {"stream": {"directory": str(self.feed.directory), "done": list(self.done), "current": self.current}}

    def load(self, meta: dict[str, Any]) -> None:
        stream = meta.get("stream")
        if not isinstance(stream, dict):
            raise DataError("the checkpoint resumed from is not of a data.follow run (it records no files done)")
        self.done = [str(n) for n in stream.get("done", [])]
        self.current = stream.get("current")

    def _dataset(self, path) -> Dataset:
        return open_dataset(self.feed.file_config(path, self.feed.file_format(path)))
