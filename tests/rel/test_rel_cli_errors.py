"""Issue 17 point 9, issue 16 point 9: every command's error cases exit 2 with one line and no traceback.

In-process (``main([...])``) for speed; one subprocess where the exit path itself is under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tierec.cli import main

TINY = ["data.synthetic.train_rows=1024", "data.synthetic.test_rows=256", "data.synthetic.cardinality_scale=0.001",
        "train.batch_size=256", "embedding.dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]"]
REPO = Path(__file__).resolve().parents[2]


def _sets(items: list[str]) -> list[str]:
    return [x for o in items for x in ("--set", o)]


def _one_line_2(capsys, argv: list[str], needle: str) -> None:
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err[-1500:])
    assert err.count("\n") == 1 and "Traceback" not in err, err[-1500:]
    assert needle in err, (needle, err)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    r = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", "--run-dir", str(r), "--no-progress", *_sets(TINY)]) == 0
    return r


def test_train_config_errors(tmp_path: Path, capsys) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [
        (["train.epochs=0"], "train.epochs"),
        (["train.epochs=-1"], "train.epochs"),
        (["train.max_steps=-5"], "train.max_steps"),
        (["train.threads=-2"], "train.threads"),
        (["train.dense_lr=-1"], "train.dense_lr"),
        (["train.eval_batches=-1"], "train.eval_batches"),
        (["data.prefetch_batches=0"], "data.prefetch_batches"),
        (["embedding.optimizer.lr=nan"], "embedding.optimizer.lr"),
        (["train.nan_policy=\"ignore\""], "train.nan_policy"),
        (["prune.enabled=true", "prune.min_dim=8"], "prune.min_dim"),
        (["store.enabled=true", f"store.disk_path={json.dumps(str(a_file))}"], "store.disk_path"),
        (["store.enabled=true", "store.disk_path=\"/sys/tierec\""], "store.disk_path"),
        (["store.enabled=true", "store.disk_path=\"/proc/x\""], "store.disk_path"),
        (["train.bogus=1"], "train.bogus"),
    ]
    if not torch.cuda.is_available():
        cases.append((["train.device=\"cuda\""], "train.device"))
    for sets, key in cases:
        _one_line_2(capsys, ["train", "--run-dir", str(tmp_path / "r"), *_sets(TINY + sets)], key)
        assert not (tmp_path / "r").exists()  # nothing is created before the config is valid
    for n in ("0", "-3"):
        _one_line_2(capsys, ["train", "--run-dir", str(tmp_path / "r"), "--nproc", n], "--nproc")
    _one_line_2(capsys, ["train", "--run-dir", str(tmp_path / "r"), "--resume", "--overwrite"], "--overwrite")
    _one_line_2(capsys, ["train", "--run-dir", str(a_file)], "not a directory")


def test_eval_and_predict_errors(run: Path, tmp_path: Path, capsys) -> None:
    for cmd in ("eval", "predict"):
        extra = ["--out", str(tmp_path / "s.txt")] if cmd == "predict" else []
        _one_line_2(capsys, [cmd, str(tmp_path / "nothing"), *extra], "nothing")
        _one_line_2(capsys, [cmd, str(tmp_path), *extra], "no checkpoint")
        _one_line_2(capsys, [cmd, str(run / "checkpoints"), "--data", str(tmp_path / "missing.txt"), *extra], "missing.txt")
        _one_line_2(capsys, [cmd, str(run / "checkpoints"), "--set", "embedding.dim=8", *extra], "does not fit")
        for sets, key in ((["train.threads=-2"], "train.threads"), (["data.prefetch_batches=0"], "data.prefetch_batches"),
                          (["train.bogus=1"], "train.bogus")) + (() if torch.cuda.is_available() else ((["train.device=\"cuda\""], "train.device"),)):
            _one_line_2(capsys, [cmd, str(run / "checkpoints"), *_sets(sets), *extra], key)
    # a sharded checkpoint manifest (the earlier format) with a missing key, and one naming a foreign file
    ck = tmp_path / "ck" / "step_00000001"
    ck.mkdir(parents=True)
    victim = tmp_path / "victim.safetensors"
    victim.write_bytes(b"x")
    for entries, needle in (([{"bytes": 1}], "malformed shard entry"), ([{"file": str(victim), "bytes": 1}], "refuses")):
        (ck / "manifest.json").write_text(json.dumps({"step": 1, "_sharded": {"format": 1, "world_size": 1, "shards": entries}}))
        _one_line_2(capsys, ["eval", str(ck)], needle)
    # a checkpoint's meta.json listing a file outside it
    good = sorted((run / "checkpoints").glob("step_*"))[-1]
    meta = json.loads((good / "meta.json").read_text())
    if "files" in meta.get("_checkpoint", {}):
        bad = tmp_path / "bad" / good.name
        bad.mkdir(parents=True)
        for p in good.iterdir():
            if p.name != "checksums.json":
                (bad / p.name).write_bytes(p.read_bytes())
        meta["_checkpoint"]["files"]["../victim.safetensors"] = 1
        (bad / "meta.json").write_text(json.dumps(meta))
        _one_line_2(capsys, ["eval", str(bad)], "only plain file names")


def test_preprocess_errors(tmp_path: Path, capsys) -> None:
    out = tmp_path / "shards"
    assert main(["preprocess", *_sets(TINY), "--out", str(out)]) == 0
    m = json.loads((out / "manifest.json").read_text())
    del m["splits"]["train"]["shards"][0]["rows"]
    (out / "manifest.json").write_text(json.dumps(m))
    _one_line_2(capsys, ["preprocess", *_sets(TINY), "--out", str(out)], "malformed manifest")
    _one_line_2(capsys, ["train", "--run-dir", str(tmp_path / "r"), "--set", f"data.source={json.dumps(str(out))}"],
                "malformed manifest")
    _one_line_2(capsys, ["preprocess", *_sets(TINY), "--rows-per-shard", "0", "--out", str(tmp_path / "s2")], "rows_per_shard")
    for sets, key in ((["data.prefetch_batches=0"], "data.prefetch_batches"), (["train.bogus=1"], "train.bogus")):
        _one_line_2(capsys, ["preprocess", *_sets(TINY + sets), "--out", str(tmp_path / "s2")], key)
    gz = tmp_path / "day.txt"
    gz.write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(200))
    _one_line_2(capsys, ["preprocess", "--set", f"data.source={json.dumps(str(gz))}", "--out", str(tmp_path / "s3")], "gzip")
    assert not (tmp_path / "s3").exists()


def test_a_failing_command_exits_2_without_abort(run: Path, tmp_path: Path) -> None:
    """As a program (its own exit path): status 2, one line, no 'terminate called' abort (status 134)."""
    bad = tmp_path / "bad.txt"
    bad.write_text("".join("x\t1\n" for _ in range(50)))
    r = subprocess.run([sys.executable, "-m", "tierec", "predict", str(run / "checkpoints"), "--data", str(bad),
                        "--out", str(tmp_path / "s.txt")], env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and "terminate called" not in r.stderr and "Traceback" not in r.stderr

