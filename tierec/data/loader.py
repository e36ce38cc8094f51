"""Produce batches ahead in a background thread so loading overlaps compute.

pyarrow and the numba kernels release the GIL, so a reader thread really runs
beside the training step. :func:`prefetch` is the mechanism (a bounded queue, the
producer's exception re-raised in the consumer, a clean stop when the consumer
stops early); :class:`BackgroundLoader` wraps a :class:`BatchSource` with it and
keeps the source's metadata.

>>> list(prefetch(lambda: iter(range(5)), depth=2))
[0, 1, 2, 3, 4]
>>> from tierec.config import DataConfig, SyntheticConfig
>>> from tierec.data import open_source
>>> cfg = DataConfig(synthetic=SyntheticConfig(train_rows=1000, test_rows=100))
>>> with BackgroundLoader(open_source(cfg, "train", batch_size=256), depth=2) as loader:
...     [b.size for b in loader]
[256, 256, 256, 232]
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tierec.batch import Batch
from tierec.data.errors import ProblemReport

if TYPE_CHECKING:
    from tierec.data.source import BatchSource

T = TypeVar("T")
_POLL = 0.1  # seconds between checks of the stop flag while the queue is full


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_DONE = object()


def prefetch(
    make_iter: Callable[[], Iterator[T]], depth: int, name: str = "tierec-prefetch", lockstep: bool = False
) -> Generator[T, None, None]:
    """Iterate ``make_iter()`` in a daemon thread, at most ``depth`` items ahead.

    ``make_iter`` is called inside the thread. Closing the returned generator (a
    ``break`` in the consumer's loop, or garbage collection) stops the producer
    and joins it. ``lockstep`` (with ``depth`` 1): the producer starts on the next
    item only once the consumer has taken the last, so it makes item ``k + 1``
    while the consumer works on item ``k`` and is never further ahead.
    """
    if depth < 1:
        raise ValueError(f"prefetch depth must be >= 1, got {depth}")
    if lockstep and depth != 1:
        raise ValueError(f"a lockstep prefetch is 1 item deep, got depth {depth}")
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    taken = threading.Semaphore(0)  # lockstep: items the consumer took

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=_POLL)
                break
            except queue.Full:
                continue
        while lockstep and not stop.is_set():
            if taken.acquire(timeout=_POLL):
                return True
        return not stop.is_set()

    def produce() -> None:
        it = None
        try:
            it = make_iter()
            for item in it:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            put(_Failed(e))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if lockstep:
                taken.release()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                thread.join(timeout=_POLL)


class BackgroundLoader:
    """Iterate a source's batches from a background thread, ``depth`` batches ahead.

    Each ``iter()`` starts a new pass (and a new thread); the batches are exactly
    the source's, in order. The source's metadata is passed through. Used as a
    context manager, leaving the ``with`` block stops any pass still running
    (e.g. after a ``break``), so no thread outlives it.
    """

    def __init__(self, source: BatchSource, depth: int = 4, *, pin: bool = False) -> None:
        """``pin``: the thread also puts each batch's dense features and labels in page-locked memory, so
        that the step's copy to a GPU does not block (``train.device = "cuda"``)."""
        if depth < 1:
            raise ValueError(f"BackgroundLoader depth must be >= 1, got {depth}")
        self.source = source
        self.depth = depth
        self.pin = pin
        # Weak: an abandoned pass must stay collectable, so that dropping it stops its thread.
        self._passes: weakref.WeakSet[Generator[Batch, None, None]] = weakref.WeakSet()

    def __iter__(self) -> Iterator[Batch]:
        source = self.source  # the producer thread must not reference the loader (and through it the pass)
        make = (lambda: (b.pin_memory() for b in source)) if self.pin else (lambda: iter(source))
        gen = prefetch(make, self.depth, name="tierec-loader")
        self._passes.add(gen)
        return gen

    def close(self) -> None:
        """Stop every pass still running and join its thread."""
        for gen in list(self._passes):
            gen.close()

    def __enter__(self) -> BackgroundLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self.source.feature_names

    @property
    def dense_names(self) -> tuple[str, ...]:
        return self.source.dense_names

    @property
    def n_dense(self) -> int:
        return self.source.n_dense

    @property
    def num_rows(self) -> int | None:
        return self.source.num_rows

    @property
    def num_batches(self) -> int | None:
        return self.source.num_batches

    @property
    def problems(self) -> ProblemReport:
        return self.source.problems
