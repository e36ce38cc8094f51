"""BackgroundLoader: same batches, exceptions reach the consumer, early stops leave no thread."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from data_helpers import assert_same_batches, criteo_line, synthetic_rows, write_lines

from tierec.config import DataConfig, SyntheticConfig
from tierec.data import BackgroundLoader, MalformedRowError, open_source, prefetch


def _threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def _wait_gone(prefix: str, earlier: frozenset[threading.Thread] = frozenset()) -> bool:
    """No thread named ``prefix``... is left but those in ``earlier`` (alive before the test: a store another test
    left to the collector keeps its disk threads until then)."""
    for _ in range(100):
        if not [t for t in _threads(prefix) if t not in earlier]:
            return True
        time.sleep(0.02)
    return False


def test_same_batches_with_and_without_loader(tmp_path: Path) -> None:
    cfg = DataConfig(synthetic=SyntheticConfig(train_rows=20_000))
    src = open_source(cfg, "train", 3000, start_batch=1)
    with BackgroundLoader(src, depth=2) as loader:
        assert loader.num_batches == 7 and loader.feature_names == src.feature_names and loader.n_dense == 13
        assert_same_batches(list(loader), list(src))
        assert_same_batches(list(loader), list(src))  # each iter() is a new pass
    path = write_lines(tmp_path / "t.txt", synthetic_rows(400))
    file_src = open_source(DataConfig(source=str(path), test_rows=100), "test", 16)
    assert_same_batches(list(BackgroundLoader(file_src, depth=3)), list(file_src))


def test_producer_exception_reaches_consumer(tmp_path: Path) -> None:
    earlier = frozenset(threading.enumerate())
    lines = [criteo_line(0) for _ in range(50)]
    lines[40] = "0\t1"
    path = write_lines(tmp_path / "t.txt", lines)
    src = open_source(DataConfig(source=str(path), test_fraction=0, strict=True), "train", 8)
    seen = 0
    with pytest.raises(MalformedRowError, match=r"t\.txt:41"):
        for batch in BackgroundLoader(src, depth=2):
            seen += batch.size
    assert seen <= 40
    assert _wait_gone("tierec-", earlier)

    def boom() -> Iterator[int]:
        yield 1
        raise RuntimeError("reader failed")

    got = []
    with pytest.raises(RuntimeError, match="reader failed"):
        for x in prefetch(boom, depth=1):
            got.append(x)
    assert got == [1]


def test_early_stop_stops_the_producer() -> None:
    earlier = frozenset(threading.enumerate())
    src = open_source(DataConfig(synthetic=SyntheticConfig(train_rows=1_000_000)), "train", 1024)
    with BackgroundLoader(src, depth=2) as loader:
        for i, _ in enumerate(loader):
            if i == 2:
                break
    assert _wait_gone("tierec-loader")
    # a pass abandoned without closing is stopped when the with-block ends
    loader = BackgroundLoader(src, depth=2)
    with loader:
        it = iter(loader)
        next(it)
        assert _threads("tierec-loader")
    assert _wait_gone("tierec-loader")
    # a pass that is simply dropped stops too
    it = iter(BackgroundLoader(src, depth=2))
    next(it)
    del it
    gc.collect()
    assert _wait_gone("tierec-", earlier)


def _counted(n: int) -> tuple[list[int], Callable[[], Iterator[int]]]:
    """(the items made so far, a maker of ``0 .. n - 1`` that records each as it makes it)."""
    produced: list[int] = []

    def items() -> Iterator[int]:
        for i in range(n):
            produced.append(i)
            yield i

    return produced, items


def test_slow_consumer_bounded_queue() -> None:
    produced, items = _counted(100)
    it = prefetch(items, depth=3)
    assert next(it) == 0
    time.sleep(0.2)
    assert len(produced) <= 5  # one taken, three queued, one waiting to be put
    it.close()
    assert _wait_gone("tierec-prefetch")
    with pytest.raises(ValueError):
        BackgroundLoader(src := open_source(DataConfig(), "test", 8), depth=0)
    assert src.num_rows == 100_000


def test_a_lockstep_producer_makes_the_next_item_only_once_the_last_was_taken() -> None:
    produced, items = _counted(100)
    it = prefetch(items, depth=1, lockstep=True)
    for k in range(5):
        assert next(it) == k
        time.sleep(0.05)  # the consumer's work: the producer makes item k + 1 meanwhile, not k + 2
        assert len(produced) == k + 2
    assert list(it) == list(range(5, 100))  # every item, in order, to the end
    assert _wait_gone("tierec-prefetch")
    with pytest.raises(ValueError, match="lockstep"):
        next(prefetch(items, depth=2, lockstep=True))
