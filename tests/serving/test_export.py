"""`tierec export`: the directory it writes, the rows sorted with bounded memory, precisions, where it refuses to write."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from serving_helpers import train
from tierec.cli import main
from tierec.serving.export import ExportConfig, export_checkpoint
from tierec.serving.manifest import ExportManifest
from tierec.serving.rows import RowChunk, decode, encode
from tierec.serving.scorer import Scorer
from tierec.serving.sorted_runs import RunWriter, merge_runs
from tierec.train.checkpoint import Checkpoint
from tierec.version import tierec_version

SYNTHETIC = ["data.synthetic.train_rows=1024", "data.synthetic.test_rows=256", "train.batch_size=256", "embedding.dim=4"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run")
    train(path, SYNTHETIC)
    return path


def test_export_directory_and_manifest(run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert "exported step 4" in capsys.readouterr().out
    manifest = ExportManifest.from_json((out / "manifest.json").read_text())
    assert manifest.tierec_version == tierec_version() and manifest.step == 4 and manifest.precision == "fp32"
    assert [f.name for f in manifest.features] == [f"C{i}" for i in range(1, 27)]
    assert manifest.schema.encoding == "hex" and manifest.schema.values == "typed" and len(manifest.schema.dense) == 13
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.pt2", "tables"]
    ckpt = Checkpoint(run / "checkpoints")
    saved = {}
    for label, records in ckpt.rows():
        saved.setdefault(label.split("/", 1)[1], []).append(records)
    for t in manifest.tables:  # every row, in id order, plain safetensors
        with safe_open(out / t.file, framework="np") as f:
            ids, rows = f.get_tensor("ids"), f.get_tensor("rows")
        want_ids = np.concatenate([r["ids"].numpy() for r in saved[t.name]])
        want_rows = np.concatenate([r["weights"].numpy() for r in saved[t.name]])
        order = np.argsort(want_ids)
        assert np.array_equal(ids, want_ids[order]) and np.array_equal(rows, want_rows[order]), t.name


def test_merge_with_a_small_budget_sorts_many_ragged_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ids = rng.choice(1 << 40, 5000, replace=False)
    lens = rng.integers(0, 3, 5000) * 4
    values = rng.standard_normal(int(lens.sum())).astype(np.float32)
    chunk = RowChunk(ids, lens, values)
    w = RunWriter(tmp_path)
    for a in range(0, 5000, 300):
        w.add(chunk.take(np.arange(a, min(a + 300, 5000))))
    out = RowChunk.concat(list(merge_runs(w.runs, np.float32, budget=1 << 12, dim=8)))
    want = chunk.take(np.argsort(ids))
    assert np.array_equal(out.ids, want.ids) and np.array_equal(out.lens, want.lens) and np.array_equal(out.values, want.values)


def test_precisions_round_trip_within_their_step() -> None:
    rng = np.random.default_rng(1)
    chunk = RowChunk(np.arange(50), np.full(50, 16), rng.standard_normal(800).astype(np.float32))
    half = encode(chunk, "fp16")
    assert half.values.dtype == np.float16 and np.abs(decode(half.values, None, None, chunk.lens) - chunk.values).max() < 2e-3
    q = encode(chunk, "int8")
    back = decode(q.values, q.scale, q.bias, chunk.lens)
    step = np.repeat(q.scale, 16)
    assert q.values.dtype == np.uint8 and bool((np.abs(back - chunk.values) <= 0.5 * step + 1e-6).all())


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_lower_precision_exports_score_close(run: Path, tmp_path: Path, precision: str) -> None:
    export_checkpoint(run, tmp_path / "fp32")
    export_checkpoint(run, tmp_path / precision, ExportConfig(precision=precision))
    rows = [{"I1": 0.3, "I2": 1.5, **{f"C{i}": i * 7 for i in range(1, 27)}}, {"C3": 5}]
    a = Scorer.load(tmp_path / "fp32").score(rows)
    b = Scorer.load(tmp_path / precision).score(rows)
    assert np.abs(a - b).max() < 0.02
    smaller = sum(p.stat().st_size for p in (tmp_path / precision / "tables").iterdir())
    assert smaller < sum(p.stat().st_size for p in (tmp_path / "fp32" / "tables").iterdir())


def test_export_replaces_an_export_and_refuses_anything_else(run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "export"
    export_checkpoint(run, out)
    first = (out / "manifest.json").stat().st_ino
    assert main(["export", str(run), "--out", str(out), "--precision", "fp16"]) == 0  # an earlier export: replaced
    assert (out / "manifest.json").stat().st_ino != first and json.loads((out / "manifest.json").read_text())["precision"] == "fp16"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # nothing left aside
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(out)
    capsys.readouterr()
    for target in (other, link, run, run / "checkpoints" / "x"):
        assert main(["export", str(run), "--out", str(target)]) == 2, target
        err = capsys.readouterr().err
        assert err.startswith("tierec: error:") and len(err.strip().splitlines()) == 1, err
    assert (other / "notes.txt").read_text() == "keep" and not list(other.glob(".*"))
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "e2")]) == 2
    assert "no checkpoint" in capsys.readouterr().err
