"""Issue 22 points 8 and 11: a repeated header column, a line longer than the reader's block, clear store messages.

In-process (``main([...])``) on tiny CSV files; the warning's format is checked
in a subprocess, where Python's own warning display would apply.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

from rel_helpers import TINY

from tierec.cli import main

REPO = Path(__file__).resolve().parents[2]
CSV_SETS = ["data.schema.categorical=[\"user\",\"item\"]", "train.batch_size=64", "train.epochs=1", "embedding.dim=4",
            "model.bottom_mlp=[8]", "model.top_mlp=[8]", "train.plots=false"]


def _sets(items: list[str]) -> list[str]:
    return [x for o in items for x in ("--set", o)]


def _csv(path: Path, header: str, rows: int = 300, long_line: int | None = None) -> Path:
    r = random.Random(0)
    lines = [header] + [f"{r.randint(0, 1)},u{r.randint(0, 20)},i{r.randint(0, 30)}" for _ in range(rows)]
    if long_line is not None:
        lines[long_line] = "1,u1," + "x" * (50 << 20)  # 50 MB in one field
    path.write_text("\n".join(lines) + "\n")
    return path


def _train(tmp_path: Path, data: Path, extra: list[str] = (), strict: bool = False) -> list[str]:
    return ["train", "--run-dir", str(tmp_path / "run"), "--no-progress", *(["--strict"] if strict else []),
            *_sets([f'data.source="{data}"', *CSV_SETS, *extra])]


def _one_line_2(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (code, err[-2000:])
    assert err.count("\n") == 1 and "Traceback" not in err, err[-2000:]
    return err


def test_a_repeated_header_column_is_an_error_naming_it(tmp_path: Path, capsys) -> None:
    data = _csv(tmp_path / "dup.csv", "label,user,user,item")
    err = _one_line_2(capsys, _train(tmp_path, data))
    assert f"{data}: its header names column 'user' twice (fields 2 and 3)" in err, err
    assert not (tmp_path / "run").exists()


def test_a_50_mb_line_is_skipped_and_counted_or_named_with_strict(tmp_path: Path, capsys) -> None:
    data = _csv(tmp_path / "long.csv", "label,user,item", long_line=150)
    capsys.readouterr()
    assert main(_train(tmp_path, data, ["train.batch_size=64"])) == 0
    err = capsys.readouterr().err
    assert "straddl" not in err
    assert "skipped 1 malformed row (line 151: a line of 52,428,806 bytes, longer than the reader's block" in err, err
    err = _one_line_2(capsys, _train(tmp_path, data, ["train.batch_size=64"], strict=True) + ["--overwrite"])
    assert f"{data}:151: a line of 52,428,806 bytes" in err, err


def test_memory_budget_0_is_reported_under_its_own_key(tmp_path: Path, capsys) -> None:
    err = _one_line_2(capsys, ["train", "--run-dir", str(tmp_path / "run"), "--no-progress",
                               *_sets(TINY + ["store.enabled=true", "store.memory_budget=0"])])
    assert "store.memory_budget is 0" in err and "cache_size" not in err, err


def test_warnings_are_one_line_of_their_own(tmp_path: Path) -> None:
    data = _csv(tmp_path / "bad.csv", "label,user,item")
    with data.open("a") as f:
        f.write("1,only-two-fields\n")
    argv = _train(tmp_path, data, ["store.memory_budget=\"1GiB\"", f'store.disk_path="{tmp_path / "disk"}"'])
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "default"}
    r = subprocess.run([sys.executable, "-m", "tierec", *argv], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    warned = [line for line in r.stderr.splitlines() if "warning" in line.lower() or "skipped" in line]
    assert warned == [
        "tierec: warning: store.enabled is false, so store.memory_budget, store.disk_path are ignored "
        "(set store.enabled=true to tier the embedding tables)",
        f"tierec: warning: {data}: skipped 1 malformed row (line 302: expected 3 comma-separated fields, found 2)",
    ], r.stderr[-2000:]
    assert ".py" not in r.stderr, r.stderr[-2000:]
