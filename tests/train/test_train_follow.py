"""`tierec train --follow` (data.follow): every file of a growing directory trained once, in name order, as it
comes; which files are done is in the checkpoints, so a stopped run resumed later ends with the same weights
as one that saw every file in one go."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tierec.config import ConfigError, DataConfig, load_config
from tierec.data import DataError
from tierec.data.follow import FileFeed
from tierec.train.checkpoint import load_checkpoint
from tierec.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
HEADER = "clicked,price,age,user,item,tags"


def _write_parts(directory: Path, names: list[str], rows: int = 512, seed: int = 0) -> None:
    """CSV files of clicks (two dense columns, user, item, tags), ``rows`` each, one per name; renamed in."""
    rng = np.random.default_rng(seed)
    directory.mkdir(exist_ok=True)
    for name in names:
        users, items = rng.zipf(1.3, rows) % 300, rng.integers(0, 50, rows)
        label = (rng.random(rows) < 1 / (1 + np.exp(-np.sin(users) - np.cos(items)))).astype(int)
        lines = [HEADER] + [f"{label[i]},{users[i] % 7 + 0.5},{20 + items[i]},u{users[i]},{items[i]},t{i % 5}|t{i % 3}"
                            for i in range(rows)]  # fmt: skip
        tmp = directory / f"{name}.part"
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, directory / name)


def _config(directory: Path) -> list[str]:
    return [f"data.source={json.dumps(str(directory))}", 'data.schema.label="clicked"', 'data.schema.dense=["price","age"]',
            'data.schema.categorical=["user","item","tags"]', 'data.schema.multi_valued=["tags"]', "embedding.dim=8",
            "train.batch_size=128", "data.follow=true", "data.follow_settle_s=0", "data.follow_poll_s=0.1",
            'train.precision="fp32"', "train.progress=false", "train.plots=false", "train.threads=1",
            "model.top_mlp=[16]", "model.bottom_mlp=[16]"]  # fmt: skip


def _final(run: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """The run's latest checkpoint, embedding rows sorted by id."""
    tensors, meta = load_checkpoint(run / "checkpoints")
    out = {}
    for k, v in tensors.items():
        if k.endswith(".ids"):
            order = torch.argsort(v)
            table = k[: -len(".ids")]
            out[k] = v[order]
            out[f"{table}.weights"] = tensors[f"{table}.weights"][order]
        elif "/" not in k and not k.startswith("rng."):
            out[k] = v
    return out, meta


def test_each_file_once_in_name_order_and_a_resumed_run_ends_the_same(tmp_path: Path) -> None:
    names = [f"part-{i}.csv" for i in range(4)]
    _write_parts(tmp_path / "all", names)
    said: list[str] = []
    over = _config(tmp_path / "all") + ["train.delta_every=3"]
    whole = Trainer(load_config(None, over + ["train.max_steps=16"]), tmp_path / "a", echo=said.append).fit()
    assert whole["steps"] == 16 and "test_auc" not in whole  # no data.test_source: nothing to evaluate on
    assert [s for s in said if "taking" in s] == [f"step {4 * i}: taking {n} (512 rows)" for i, n in enumerate(names)]
    ckpts = sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir() if p.name.startswith("delta_"))
    steps = [int(n.split("_")[1]) for n in ckpts]
    assert {4, 8, 12} <= set(steps)  # a file's last steps are published when it is done (besides every 3 steps)

    # the same files arriving while the run waits, the run stopped half-way through the second (max_steps)
    _write_parts(tmp_path / "staged", names)  # (the same rows as in "all")
    (tmp_path / "grow").mkdir()
    for n in names[:2]:
        os.replace(tmp_path / "staged" / n, tmp_path / "grow" / n)
    over = _config(tmp_path / "grow") + ["train.delta_every=3"]
    first = Trainer(load_config(None, over + ["train.max_steps=6"]), tmp_path / "b").fit()
    assert first["steps"] == 6
    meta = load_checkpoint(tmp_path / "b" / "checkpoints")[1]
    assert meta["stream"] == {"directory": str(tmp_path / "grow"), "done": ["part-0.csv"], "current": "part-1.csv"}
    for n in names[2:]:
        os.replace(tmp_path / "staged" / n, tmp_path / "grow" / n)
    said.clear()
    resumed = Trainer(load_config(None, over + ["train.max_steps=16"]), tmp_path / "b", resume=True, echo=said.append).fit()
    assert resumed["steps"] == 16
    assert [s for s in said if "part-" in s] == ["step 6: continuing at batch 2: part-1.csv (512 rows)",
                                                 "step 8: taking part-2.csv (512 rows)", "step 12: taking part-3.csv (512 rows)"]  # fmt: skip
    a, ma = _final(tmp_path / "a")
    b, mb = _final(tmp_path / "b")
    # (train.max_steps came with the last batch of part-3: a resume would find it has no batch left)
    assert mb["stream"] == {"directory": str(tmp_path / "grow"), "done": names[:3], "current": "part-3.csv"}
    assert mb["position"]["batch_in_epoch"] == 4 and mb["config"]["data"]["format"] == "csv"
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_what_is_taken_when(tmp_path: Path) -> None:
    d = tmp_path / "in"
    _write_parts(d, ["b.csv", "a.csv"], rows=4)
    for name in (".hidden.csv", "c.csv.tmp", "d.csv.part"):
        (d / name).write_text(HEADER + "\n")
    (d / "sub").mkdir()
    feed = FileFeed(DataConfig(source=str(d), follow=True, follow_settle_s=30))
    assert feed.ready(done=()) == []  # written just now: not settled for 30 s
    past = time.time() - 60
    for name in ("a.csv", "b.csv", ".hidden.csv", "c.csv.tmp", "d.csv.part"):
        os.utime(d / name, (past, past))
    assert [p.name for p in feed.ready(done=())] == ["a.csv", "b.csv"]
    assert [p.name for p in feed.ready(done={"a.csv"})] == ["b.csv"]
    said: list[str] = []
    waited = FileFeed(DataConfig(source=str(d), follow=True, follow_poll_s=0.05), echo=said.append)
    t0 = time.monotonic()
    polls = iter(range(10))
    assert waited.wait(done={"a.csv", "b.csv"}, stopped=lambda: next(polls) >= 3, say="step 9: ") is None
    assert said == [f"step 9: waiting for new files in {d} (looking every 0.05 s)"] and time.monotonic() - t0 < 5
    (d / "x.dat").write_text(HEADER + "\n")
    with pytest.raises(DataError, match=r"x\.dat: cannot infer the format from the name; set data.format"):
        feed.file_format(d / "x.dat")
    with pytest.raises(DataError, match=r"y\.parquet is not a csv file .* data.format = 'csv'"):
        FileFeed(DataConfig(source=str(d), follow=True, format="csv")).file_format(d / "y.parquet")
    with pytest.raises(DataError, match="does not exist"):
        FileFeed(DataConfig(source=str(tmp_path / "none"), follow=True)).ready(done=())


def test_a_file_with_other_columns_is_one_line(tmp_path: Path) -> None:
    d = tmp_path / "in"
    _write_parts(d, ["a.csv"], rows=256)
    (d / "b.csv").write_text("clicked,price,user,item,tags\n1,1,u1,3,t1\n")
    with pytest.raises(DataError, match=r"b\.csv"):
        Trainer(load_config(None, _config(d) + ["train.max_steps=4"]), tmp_path / "r").fit()


@pytest.mark.parametrize(
    ("over", "says"),
    [
        (["data.follow=true"], "data.follow trains the new files of a directory"),
        (["data.follow=true", 'data.source="x"', "data.validation_rows=10"], "has no validation split"),
        (["data.follow=true", 'data.source="x"', "train.eval_every=5"], "evaluates on data.test_source"),
        (["data.follow_poll_s=0"], "data.follow_poll_s must be a positive"),
        (["data.follow_settle_s=-1"], "data.follow_settle_s must be >= 0"),
    ],
)
def test_bad_follow_settings_are_one_line(over: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(None, over)


def test_sigterm_while_waiting_saves_and_resume_takes_the_next_file(tmp_path: Path) -> None:
    d = tmp_path / "in"
    _write_parts(d, ["part-0.csv"])
    run = tmp_path / "run"
    sets = [a for o in _config(d) if not o.startswith("data.follow=") for a in ("--set", o)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "tierec", "train", "--follow", "--run-dir", str(run), *sets]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 120
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line.rstrip())
            if "waiting for new files" in line:
                proc.send_signal(signal.SIGTERM)
                break
            assert time.monotonic() < deadline, lines
        out = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    assert lines[-2:] == ["step 0: taking part-0.csv (512 rows)", f"step 4: waiting for new files in {d} (looking every 0.1 s)"]
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "interrupted at step 4; checkpoint saved" in out and "Traceback" not in out
    assert 'format = "csv"' in (run / "config.toml").read_text()  # how the files are read, for export and resume

    _write_parts(d, ["part-1.csv"], seed=1)
    resumed = subprocess.run([sys.executable, "-m", "tierec", "train", "--run-dir", str(run), "--resume",
                              "--set", "train.max_steps=8"], env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "step 4: taking part-1.csv (512 rows)" in resumed.stdout
    assert load_checkpoint(run / "checkpoints")[1]["stream"]["done"] == ["part-0.csv"]  # stopped at max_steps inside part-1
