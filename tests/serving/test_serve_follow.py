"""`tierec serve --follow`: deltas and newer full checkpoints of the run, taken up between requests.

The reference is always a scorer loaded from an export of the run's newer full checkpoint: an export plus
the deltas published since must score the same (fp32: within 1e-6; the rows of fp16 and int8 exports are
encoded by the same function, so they match too)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from serving_helpers import REPO, call as _call, clicks_config, csv_records, free_port as _free_port, storage_config, train, write_clicks_csv
from tierec.config import ConfigError
from tierec.serving.export import ExportConfig, export_checkpoint
from tierec.serving.follow import RunFollower
from tierec.serving.scorer import Scorer
from tierec.train.checkpoint import load_checkpoint

pytest.importorskip("starlette")
pytest.importorskip("orjson")
pytest.importorskip("httptools")
pytest.importorskip("uvicorn")

TTL = ["store.ttl_steps=2", "store.interval=2"]  # rows expire: the deltas delete ids


def _setup(tmp: Path, storage: str = "plain", precision: str = "fp32") -> tuple[list[str], Path, Path]:
    """A run trained to step 4 (exported), then on to step 8 (deltas 6 and 8 of step 4, full checkpoint 8):
    the overrides, the run, and the export of step 4."""
    clicks = write_clicks_csv(tmp / "clicks.csv", rows=1500)
    over = clicks_config(clicks) + ['model.name="deepfm"', "train.delta_every=2"] + storage_config(storage, tmp)
    over += TTL if "tiered" in storage else []
    train(tmp / "run", over + ["train.max_steps=4"])
    export_checkpoint(tmp / "run", tmp / "ex4", ExportConfig(precision=precision))
    train(tmp / "run", over + ["train.max_steps=8"], resume=True)
    return over, tmp / "run", tmp / "ex4"


def _aside(run: Path, name: str, tmp: Path) -> Path:
    """Move a publication out of the run's checkpoints (as if training had not written it yet)."""
    (tmp / "aside").mkdir(exist_ok=True)
    return Path(shutil.move(run / "checkpoints" / name, tmp / "aside" / name))


def _reference(ckpt: Path, out: Path, precision: str) -> Scorer:
    export_checkpoint(ckpt, out, ExportConfig(precision=precision))
    return Scorer.load(out)


@pytest.mark.parametrize(("storage", "precision"),
                         [("plain", "fp32"), ("tiered", "int8"), ("plain", "fp16"), ("pruned", "fp32"), ("pruned", "int8")])
def test_deltas_then_a_full_checkpoint_score_as_exports_of_them(tmp_path: Path, storage: str, precision: str) -> None:
    over, run, ex4 = _setup(tmp_path, storage, precision)
    names = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(("step_", "delta_")))
    assert names == ["delta_00000006_of_00000004", "delta_00000008_of_00000004", "step_00000004", "step_00000008"]
    if storage == "tiered":  # expired rows: the deltas delete ids, and serving must drop them
        assert load_checkpoint(run / "checkpoints" / names[1])[0]["deleted/emb/user"].numel() > 0
    if storage == "pruned":  # pruned at step 8: the delta's rows are at their own dims, as the export's
        delta8 = load_checkpoint(run / "checkpoints" / names[1])[0]
        dims = torch.cat([v for k, v in delta8.items() if k.startswith("emb/") and k.endswith(".dims")])
        assert dims.numel() and int(dims.min()) < 8
    step8 = _aside(run, "step_00000008", tmp_path)
    records = csv_records(tmp_path / "clicks.csv")
    said: list[str] = []
    with RunFollower(run, echo=said.append) as follower:
        served = follower.start(Scorer.load(ex4))
        before = served.score(records)
        newer = follower.poll(served)
        assert newer is not None and said[0].startswith("step 6: applied delta_00000006_of_00000004")
        assert newer.describe()["step"] == 8 and newer.describe()["export_step"] == 4
        assert newer.describe()["delta"]["name"] == "delta_00000008_of_00000004"
        ref8 = _reference(step8, tmp_path / "ex8", precision).score(records)
        assert np.abs(newer.score(records) - ref8).max() <= 1e-6
        assert np.array_equal(served.score(records), before)  # the scorer served before is untouched
        assert np.abs(before - ref8).max() > 1e-3  # (and the deltas did change the scores)
        assert follower.poll(newer) is None  # nothing new

        shutil.move(step8, run / "checkpoints" / "step_00000008")
        assert follower.poll(newer) is None  # a full checkpoint of the step served: nothing to take up
        train(run, over + ["train.max_steps=12"], resume=True)  # deltas 10, 12 of step 8, and full 12
        newest = follower.poll(newer)
        assert newest is not None and newest.describe()["checkpoint"] == "step_00000012"
        assert newest.describe()["step"] == 12 and newest.describe()["delta"] is None
        ref12 = _reference(run / "checkpoints" / "step_00000012", tmp_path / "ex12", precision).score(records)
        assert np.abs(newest.score(records) - ref12).max() <= 1e-6
        assert [p.name for p in follower.workspace.iterdir()] == ["step_00000012"]
    assert not follower.workspace.exists()


def test_a_damaged_delta_is_reported_once_and_a_newer_full_checkpoint_moves_on(tmp_path: Path) -> None:
    _over, run, ex4 = _setup(tmp_path)
    step8 = _aside(run, "step_00000008", tmp_path)
    part = run / "checkpoints" / "delta_00000006_of_00000004" / "tensors.safetensors"
    data = bytearray(part.read_bytes())
    data[-1] ^= 1
    part.write_bytes(bytes(data))
    said: list[str] = []
    with RunFollower(run, echo=said.append) as follower:
        served = follower.start(Scorer.load(ex4))
        assert follower.poll(served) is None and follower.poll(served) is None
        assert len(said) == 1 and said[0].startswith("cannot take up delta_00000006_of_00000004: ")
        assert "checksum" in said[0] and "still serving" in said[0] and "\n" not in said[0]
        shutil.move(step8, run / "checkpoints" / "step_00000008")
        newer = follower.poll(served)
        assert newer is not None and newer.describe()["step"] == 8 and newer.describe()["checkpoint"] == "step_00000008"


def test_an_export_of_another_run_is_refused(tmp_path: Path) -> None:
    _over, run, ex4 = _setup(tmp_path)
    other = tmp_path / "other"
    shutil.copytree(run, other)
    with RunFollower(other) as follower, pytest.raises(ConfigError, match="was made from .* not from a checkpoint of this run"):
        follower.start(Scorer.load(ex4))
    with pytest.raises(ConfigError, match="no such run directory"):
        RunFollower(tmp_path / "nothing")


def _wait_for(url: str, check, proc: subprocess.Popen, timeout: float = 60) -> dict:
    """What /version says once ``check`` holds for it (the server may still be starting)."""
    deadline = time.monotonic() + timeout
    body: dict = {}
    while True:
        try:
            status, body = _call(url + "/version", timeout=5)
            if status == 200 and check(body):
                return body
        except OSError:
            assert proc.poll() is None, "the server ended"
        assert time.monotonic() < deadline, f"the server did not get there: {body}"
        time.sleep(0.1)


def test_serve_follow_over_http(tmp_path: Path) -> None:
    over, run, ex4 = _setup(tmp_path)
    held = [_aside(run, n, tmp_path) for n in ("delta_00000006_of_00000004", "delta_00000008_of_00000004", "step_00000008")]
    records = csv_records(tmp_path / "clicks.csv")[:200]
    shutil.move(held[0], run / "checkpoints" / held[0].name)  # the scores of step 6, for what a request may see
    with RunFollower(run, echo=lambda line: None) as follower:
        at6 = follower.poll(follower.start(Scorer.load(ex4))).score(records)  # type: ignore[union-attr]
    shutil.move(run / "checkpoints" / held[0].name, held[0])
    port = _free_port()
    scratch = tmp_path / "scratch"  # the server's temp directory: its follower's workspace goes there
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(scratch)}
    cmd = [sys.executable, "-m", "tierec", "serve", str(ex4), "--port", str(port), "--follow", str(run), "--poll", "0.2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(url, lambda v: True, proc, timeout=90)
        version = _call(url + "/version")[1]
        assert version["step"] == 4 and version["delta"] is None and version["checkpoint"] is None
        at4 = _call(url + "/score", {"rows": records})[1]["scores"]

        seen: list[list[float]] = []  # a client scoring all along: every answer is of one whole state
        stop = threading.Event()
        client = threading.Thread(target=lambda: [seen.append(_call(url + "/score", {"rows": records})[1]["scores"])
                                                  for _ in iter(stop.is_set, True)])  # fmt: skip
        client.start()
        for path in held[:2]:  # published one at a time, renamed in as training publishes them
            shutil.move(path, run / "checkpoints" / path.name)
            step = int(path.name.split("_")[1])
            version = _wait_for(url, lambda v, s=step: v["step"] == s, proc)
            assert version["delta"]["name"] == path.name and version["delta"]["saved_at"] <= version["delta"]["applied_at"]
        stop.set()
        client.join(timeout=60)
        ref8 = _reference(held[2], tmp_path / "ex8", "fp32").score(records)
        states = [np.array(at4), at6, ref8]
        which = [next((i for i, st in enumerate(states) if np.abs(np.array(got) - st).max() <= 1e-6), -1) for got in seen]
        assert len(seen) > 3 and -1 not in which and which == sorted(which) and which[-1] == 2  # no half delta, no going back
        assert np.abs(np.array(at4) - at6).max() > 1e-3 and np.abs(at6 - ref8).max() > 1e-3

        shutil.move(held[2], run / "checkpoints" / held[2].name)
        train(run, over + ["train.max_steps=12"], resume=True)  # while the server follows
        version = _wait_for(url, lambda v: v["step"] == 12, proc)
        ref12 = _reference(run / "checkpoints" / "step_00000012", tmp_path / "ex12", "fp32").score(records)
        scores = np.array(_call(url + "/score", {"rows": records})[1]["scores"])
        assert np.abs(scores - ref12).max() <= 1e-6
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert "applied delta_00000006_of_00000004" in out and "applied delta_00000008_of_00000004" in out, out
    assert "Traceback" not in out, out
    # SIGTERM: a graceful stop that takes the follower's copies of full checkpoints with it
    assert proc.returncode == 143 and "serve stopped by SIGTERM" in out, (proc.returncode, out)
    assert list(scratch.iterdir()) == []
