"""Issue 22 point 7: a config that cannot fit in memory is refused in one line, naming the keys, before any work.

The file has 2,000 rows whose 40 categorical columns never repeat a value: at
``embedding.dim=100000`` (Adam, 1.2 MB a row) its tables need about 86 GB. The
child runs under ``ulimit -v`` 64 GiB so that the refusal does not depend on
this machine's memory.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rel_helpers import TINY

from tierec.cli import main
from tierec.config import ConfigError, load_config
from tierec.train.components import Components

REPO = Path(__file__).resolve().parents[2]
COLUMNS = 40


def _sets(items: list[str]) -> list[str]:
    return [x for o in items for x in ("--set", o)]


def _wide_file(path: Path, rows: int = 2000) -> Path:
    names = [f"c{j}" for j in range(COLUMNS)]
    lines = [",".join(["label", *names])]
    lines += [",".join([str(i % 2), *(f"v{i}_{j}" for j in range(COLUMNS))]) for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (64 << 30, resource.RLIM_INFINITY))


def test_a_huge_embedding_dim_on_a_small_file_exits_2_at_once(tmp_path: Path) -> None:
    data = _wide_file(tmp_path / "small.csv")
    run = tmp_path / "run"
    schema = "data.schema.categorical=[" + ",".join(f'"c{j}"' for j in range(COLUMNS)) + "]"
    argv = ["train", "--run-dir", str(run), "--no-progress", *_sets([f'data.source="{data}"', schema, "embedding.dim=100000"])]
    t0, cpu0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, "-m", "tierec", *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=_limit_address_space)
    took, cpu1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    err = r.stderr
    assert r.returncode == 2, (r.returncode, err[-2000:])
    assert err.count("\n") == 1 and "Traceback" not in err, err[-2000:]
    assert err.startswith("tierec: error: not enough memory: this config needs at least ") and "embedding.dim" in err, err
    assert cpu < 10 and took < 60, (cpu, took)  # seconds of its own CPU (the wall clock of a shared machine varies)
    assert not run.exists()


def test_a_terabyte_store_budget_is_refused(tmp_path: Path, capsys) -> None:
    capsys.readouterr()
    code = main(["train", "--run-dir", str(tmp_path / "run"), "--no-progress",
                 *_sets(TINY + ["store.enabled=true", "store.memory_budget=1TiB"])])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert err.count("\n") == 1 and "not enough memory" in err and "store.memory_budget" in err, err
    assert not (tmp_path / "run").exists()


def test_the_library_builder_refuses_it_too() -> None:
    with pytest.raises(ConfigError, match=r"not enough memory: .*store\.memory_budget"):
        Components.build(load_config(None, ["store.enabled=true", "store.memory_budget=1TiB"]), ["C1", "C2"], n_dense=1)
