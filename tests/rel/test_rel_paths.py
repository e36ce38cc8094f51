"""Issue 17 points 1-3: tierec touches only its own files; shards are swapped in atomically; outputs never alias inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tierec.cli import main
from tierec.config import DataConfig, SyntheticConfig
from tierec.data import DataError, open_source, preprocess
from tierec.data.errors import MalformedRowError

SMALL = DataConfig(synthetic=SyntheticConfig(train_rows=600, test_rows=100))


def _criteo_lines(n: int, bad_at: int | None = None) -> str:
    rows = []
    for i in range(n):
        fields = [str(i % 2), *(str(j + i) for j in range(13)), *(f"{(i * 31 + f) % 4096:08x}" for f in range(26))]
        rows.append("\t".join(fields) if i != bad_at else "1\t2\t3")
    return "".join(r + "\n" for r in rows)


def test_preprocess_never_deletes_files_its_manifest_names_outside_the_directory(tmp_path: Path) -> None:
    out = tmp_path / "shards"
    preprocess(SMALL, out, rows_per_shard=300, progress=False)
    victim_abs = tmp_path / "victim_abs.txt"
    victim_rel = tmp_path / "victim_rel.txt"
    victim_abs.write_text("keep me")
    victim_rel.write_text("keep me too")
    m = json.loads((out / "manifest.json").read_text())
    m["splits"]["train"]["shards"] += [{"file": str(victim_abs), "rows": 1}, {"file": "../victim_rel.txt", "rows": 1}]
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="refuses file name"):
        preprocess(SMALL, out, rows_per_shard=300, progress=False)
    with pytest.raises(DataError, match="refuses file name"):
        open_source(DataConfig(source=str(out)), "train", 64)
    assert victim_abs.read_text() == "keep me" and victim_rel.read_text() == "keep me too"
    assert (out / "train-00000.arrow").is_file()  # nothing of the old set was deleted either
    assert main(["preprocess", "--set", "data.synthetic.train_rows=600", "--out", str(out)]) == 2


def test_preprocess_keeps_old_shards_until_the_new_ones_are_complete(tmp_path: Path) -> None:
    src = tmp_path / "day.txt"
    src.write_text(_criteo_lines(200))
    out = tmp_path / "shards"
    cfg = DataConfig(source=str(src), test_rows=50, strict=True)
    preprocess(cfg, out, rows_per_shard=64, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # a --strict failure on a bad row: the old shards stay whole, no temporary directory stays behind
    src.write_text(_criteo_lines(200, bad_at=120))
    with pytest.raises(MalformedRowError, match="day.txt:121"):
        preprocess(cfg, out, rows_per_shard=100, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["day.txt", "shards"]
    # a stray user file: refused before anything is written or deleted
    (out / "README.txt").write_text("my notes")
    src.write_text(_criteo_lines(200))
    with pytest.raises(DataError, match=r"does not list \(\['README.txt'\]\)"):
        preprocess(cfg, out, rows_per_shard=100, progress=False)
    assert (out / "README.txt").read_text() == "my notes" and all((out / n).is_file() for n in before)
    # without it, a rewrite replaces exactly the old set
    (out / "README.txt").unlink()
    preprocess(cfg, out, rows_per_shard=100, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "test-00000.arrow", "train-00000.arrow", "train-00001.arrow"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["day.txt", "shards"]


def test_outputs_never_alias_inputs(tmp_path: Path, capsys) -> None:
    src = tmp_path / "day.txt"
    src.write_text(_criteo_lines(300))
    original = src.read_bytes()
    assert main(["preprocess", "--set", f"data.source={json.dumps(str(src))}", "--out", str(src)]) == 2
    assert "would overwrite the input" in capsys.readouterr().err
    run = tmp_path / "run"
    args = ["train", "--run-dir", str(run), "--no-progress", "--set", f"data.source={json.dumps(str(src))}",
            "--set", "data.test_rows=60", "--set", "train.batch_size=64", "--set", "embedding.dim=4",
            "--set", "model.bottom_mlp=[8]", "--set", "model.top_mlp=[8]"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["predict", str(run / "checkpoints"), "--data", str(src), "--out", str(src)]) == 2
    err = capsys.readouterr().err
    assert "would overwrite the input" in err and err.count("\n") == 1
    assert main(["predict", str(run / "checkpoints"), "--out", str(src)]) == 2  # the run's own data
    assert src.read_bytes() == original
    assert main(["predict", str(run / "checkpoints"), "--out", str(run / "checkpoints" / "x.txt")]) == 2
