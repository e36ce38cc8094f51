"""Issue 17 point 9: a full disk (disk tier, checkpoint) and an out-of-memory batch are one line, exit 2, resumable.

The disk really fills: a small tmpfs is mounted for the test (root only; skipped
where mounting is not allowed). Memory really runs out: an allocation beyond an
address-space limit set in the child process.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rel_helpers import TINY

from tierec.cli import main
from tierec.errors import free_bytes

def _sets(items: list[str]) -> list[str]:
    return [x for o in items for x in ("--set", o)]


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs at ``tmp_path/fs`` (resize with ``mount -o remount,size=..``); skip if it cannot be mounted."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _one_line_2(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (code, err[-2000:])
    assert err.count("\n") == 1 and "Traceback" not in err, err[-2000:]
    return err


def test_disk_tier_full_names_the_directory_and_bytes_and_resumes_elsewhere(small_fs: Path, tmp_path: Path, capsys) -> None:
    subprocess.run(["mount", "-o", "remount,size=64k", str(small_fs)], check=True)
    run = tmp_path / "run"
    tiered = ["data.synthetic.train_rows=4096", "data.synthetic.cardinality_scale=0.01", "store.enabled=true",
              "store.memory_budget=64KiB", "store.cache_size=64KiB", "store.host_size=0",
              f'store.disk_path="{small_fs}"', "train.checkpoint_every=4", "train.eval_batches=1"]
    err = _one_line_2(capsys, ["train", "--run-dir", str(run), "--no-progress", *_sets(TINY + tiered)])
    assert f"disk full: the disk tier's rows in {small_fs}: a write of " in err and " bytes did not fit (" in err, err
    assert "store.disk_path" in err and "--resume" in err
    stopped = int((run / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    assert 0 < stopped < 16
    roomy = tmp_path / "roomy"  # the disk tier's file is scratch: it may move on resume
    assert main(["train", "--run-dir", str(run), "--resume", "--no-progress", "--set", f'store.disk_path="{roomy}"']) == 0
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000016"


def test_disk_full_during_a_checkpoint_names_it_and_the_run_resumes(small_fs: Path, capsys) -> None:
    run = small_fs / "run"
    base = ["train", "--run-dir", str(run), "--no-progress"]
    assert main([*base, *_sets(TINY + ["train.max_steps=2", "train.eval_batches=1"])]) == 0
    ckpt_bytes = sum(p.stat().st_blocks * 512 for p in (run / "checkpoints" / "step_00000002").iterdir())
    filler = small_fs / "filler"
    with open(filler, "wb") as f:  # leave room for about half a checkpoint
        f.write(b"\1" * (free_bytes(small_fs) - ckpt_bytes // 2))
    err = _one_line_2(capsys, [*base, "--resume", "--set", "train.max_steps=4"])
    assert f"disk full: the checkpoint file {run / 'checkpoints'}/.tmp-step_00000004-" in err, err
    assert ": a write of " in err and "bytes free there" in err and "--resume" in err
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000002"
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]  # the partial one is gone
    filler.unlink()
    assert main([*base, "--resume", "--set", "train.max_steps=4"]) == 0
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000004"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux")
def test_a_batch_beyond_memory_is_one_line(tmp_path: Path, capsys) -> None:
    """A 65,536-row batch through a 2^20-wide layer needs 256 GiB: refused under a 64 GiB address-space limit."""
    sets = ["data.synthetic.train_rows=65536", "data.synthetic.test_rows=256", "data.synthetic.cardinality_scale=0.001",
            "train.batch_size=65536", "embedding.dim=4", "model.bottom_mlp=[1048576]", "model.top_mlp=[8]"]
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = 64 << 30 if hard == resource.RLIM_INFINITY else min(hard, 64 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))  # the soft limit only: it is raised back below
    try:
        err = _one_line_2(capsys, ["train", "--run-dir", str(tmp_path / "run"), "--no-progress", *_sets(sets)])
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert "out of memory (allocating " in err and "bytes failed); lower train.batch_size" in err, err
    assert not (tmp_path / "run").exists()  # it failed before its first checkpoint: nothing left behind
