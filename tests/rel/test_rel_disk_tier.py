"""Issue 22 point 5: a disk tier file truncated or changed from outside is a one-line error, never rows of zeros.

The file is unlinked when opened, so only its descriptor reaches it: the test
truncates it through ``/proc/self/fd`` as another process would through
``/proc/PID/fd``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from rel_helpers import TINY

from tierec.cli import main
from tierec.errors import DiskTierError
from tierec.store.disk import DiskTier


def _sets(items: list[str]) -> list[str]:
    return [x for o in items for x in ("--set", o)]


def _truncate(fd: int, size: int = 0) -> None:
    """Truncate the (unlinked) file behind ``fd`` through a descriptor of its own, as an outsider would."""
    other = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY)
    try:
        os.ftruncate(other, size)
    finally:
        os.close(other)


@pytest.fixture
def tier(tmp_path: Path):
    d = DiskTier(str(tmp_path), width=3, segment_rows=4)
    yield d
    d.close()


def _rows(n: int) -> np.ndarray:
    return np.arange(3 * n, dtype=np.float32).reshape(n, 3)


def test_a_truncated_file_is_an_error_on_read_and_on_write(tier: DiskTier) -> None:
    slots = tier.append(np.arange(6), _rows(6))
    _truncate(tier.fd, tier.rec_bytes * 2)
    with pytest.raises(DiskTierError, match=r"the disk tier file .*tierec-.*\.rows: it holds 32 bytes where 96 were written"):
        tier.read(slots[:1], lids=np.array([0]))  # even a record still inside the file: the file is damaged
    with pytest.raises(DiskTierError, match="truncated outside tierec"):
        tier.append(np.array([7]), _rows(1))  # a write past the end would leave a hole of zeros


def test_a_record_overwritten_from_outside_is_an_error(tier: DiskTier) -> None:
    slots = tier.append(np.arange(1, 5), _rows(4))
    other = os.open(f"/proc/self/fd/{tier.fd}", os.O_WRONLY)
    os.pwrite(other, b"\0" * tier.rec_bytes, int(slots[2]) * tier.rec_bytes)  # a hole's zeros, same size
    os.close(other)
    assert tier.read(slots[:2], lids=np.array([1, 2])).tolist() == _rows(2).tolist()
    with pytest.raises(DiskTierError, match=r"slot 2 holds row 0, row 3 was written"):
        tier.read(slots, lids=np.arange(1, 5))


def test_truncating_a_running_disk_tier_stops_the_run_in_one_line_without_a_checkpoint(tmp_path: Path, capsys, monkeypatch) -> None:
    run, disk = tmp_path / "run", tmp_path / "disk"
    ckpts = run / "checkpoints"
    seen: dict[str, object] = {"appends": 0}
    real_append = DiskTier.append

    def append_then_truncate(self: DiskTier, lids: np.ndarray, records: np.ndarray) -> np.ndarray:
        out = real_append(self, lids, records)
        seen["appends"] = int(seen["appends"]) + 1
        if seen["appends"] == 6:  # a few steps in, some rows on disk: an outsider truncates the file
            seen["path"], seen["kept"] = self.path, sorted(p.name for p in ckpts.glob("step_*"))
            _truncate(self.fd)
        return out

    monkeypatch.setattr(DiskTier, "append", append_then_truncate)
    tiered = ["data.synthetic.train_rows=4096", "data.synthetic.cardinality_scale=0.01", "store.enabled=true",
              "store.memory_budget=64KiB", "store.cache_size=64KiB", "store.host_size=0",
              f'store.disk_path="{disk}"', "train.checkpoint_every=2", "train.eval_batches=1"]
    capsys.readouterr()
    code = main(["train", "--run-dir", str(run), "--no-progress", *_sets(TINY + tiered)])
    err = capsys.readouterr().err
    assert "path" in seen, "the disk tier was never truncated: the test's config no longer spills to disk"
    assert code == 2, (code, err[-2000:])
    assert err.count("\n") == 1 and "Traceback" not in err, err[-2000:]
    assert f"the disk tier file {seen['path']}: " in err and "truncated" in err and "--resume" in err, err
    assert sorted(p.name for p in ckpts.glob("step_*")) == seen["kept"]  # nothing saved of the damaged state
