"""A new user's workflow (issue 16): scoring files without labels, label thresholds and label
errors, undefined test AUC, a string column declared dense, several --config files."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from data_helpers import synthetic_rows, write_lines  # noqa: E402

from tierec.cli import main  # noqa: E402
from tierec.config import ConfigError, DataConfig, SchemaConfig, load_config  # noqa: E402
from tierec.data import DataError, open_source  # noqa: E402
from tierec.train.components import Components  # noqa: E402
from tierec.train.evaluate import predict  # noqa: E402

TINY = ["train.batch_size=32", "train.progress=false", "embedding.dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]"]


def _parts(cfg):
    probe = open_source(cfg.data, "all", 32, label_optional=True)
    return Components.build(cfg, probe.feature_names, probe.n_dense)


def test_predict_scores_a_criteo_file_without_its_label_column(tmp_path: Path) -> None:
    lines = synthetic_rows(50)
    lines[7] = "1\t2"  # malformed: skipped, the other rows keep their row numbers
    labeled = write_lines(tmp_path / "labeled.txt", lines)
    unlabeled = write_lines(tmp_path / "new.txt", [line.split("\t", 1)[1] if "\t" in line else line for line in lines])
    cfg = load_config(None, [f"data.source={str(labeled)!r}", *TINY])
    parts = _parts(cfg)
    with pytest.warns(UserWarning, match="skipped 1 malformed row"):
        assert predict(cfg, parts, "all", tmp_path / "a.csv") == 49
    cfg_new = load_config(None, [f"data.source={str(unlabeled)!r}", *TINY])
    with pytest.warns(UserWarning, match="skipped 1 malformed row"):
        assert predict(cfg_new, parts, "all", tmp_path / "b.parquet") == 49
    a, b = pacsv.read_csv(tmp_path / "a.csv"), pq.read_table(tmp_path / "b.parquet")
    assert a.column_names == ["row", "score", "label"] and b.column_names == ["row", "score"]
    assert a["row"].to_pylist() == b["row"].to_pylist() == [i for i in range(50) if i != 7]
    np.testing.assert_allclose(a["score"].to_numpy(), b["score"].to_numpy(), rtol=1e-6)
    assert a["label"].to_pylist() == [float(line.split("\t")[0]) for i, line in enumerate(lines) if i != 7]


def test_predict_cli_writes_the_key_column_of_a_csv_without_labels(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(0)
    n = 96
    user = [f"u{rng.integers(20)}" for _ in range(n)]
    item = [f"i{rng.integers(30)}" for _ in range(n)]
    clicked = rng.integers(0, 2, n)
    pacsv.write_csv(pa.table({"event": [f"e{i}" for i in range(n)], "user": user, "item": item, "clicked": clicked}), tmp_path / "t.csv")
    new = pa.table({"event": ["x1", "x2", "x3"], "user": ["u1", "u2", "zz"], "item": ["i1", "i9", "i3"]})
    pacsv.write_csv(new, tmp_path / "new.csv")
    over = ["data.source=" + repr(str(tmp_path / "t.csv")), "data.schema.label=clicked", 'data.schema.categorical=["user","item"]', *TINY]
    args = [x for o in over for x in ("--set", o)]
    assert main(["train", *args, "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 0
    out = tmp_path / "scores.csv"
    assert main(["predict", str(tmp_path / "run" / "checkpoints"), "--data", str(tmp_path / "new.csv"), "--out", str(out), "--key", "event"]) == 0
    table = pacsv.read_csv(out)
    assert table.column_names == ["event", "score"] and table["event"].to_pylist() == ["x1", "x2", "x3"]
    assert all(0 < s < 1 for s in table["score"].to_pylist())


def _ratings(tmp_path: Path, n: int = 60) -> Path:
    rng = np.random.default_rng(1)
    rating = rng.integers(1, 6, n)
    table = pa.table({"user": [f"u{i % 7}" for i in range(n)], "item": [f"i{i % 5}" for i in range(n)], "rating": rating})
    pacsv.write_csv(table, tmp_path / "r.csv")
    return tmp_path / "r.csv"


def test_label_threshold_turns_ratings_into_clicks(tmp_path: Path) -> None:
    path = _ratings(tmp_path)
    schema = SchemaConfig(label="rating", categorical=["user", "item"], label_threshold=4)
    (batch,) = list(open_source(DataConfig(source=str(path), schema=schema, test_fraction=0), "train", 100))
    ratings = pacsv.read_csv(path)["rating"].to_numpy()
    assert batch.labels.tolist() == (ratings >= 4).astype(np.float32).tolist()


def test_a_label_that_is_not_0_or_1_is_an_error_naming_file_line_and_value(tmp_path: Path) -> None:
    path = _ratings(tmp_path)
    first_bad = int(np.flatnonzero(pacsv.read_csv(path)["rating"].to_numpy() > 1)[0])
    value = pacsv.read_csv(path)["rating"][first_bad].as_py()
    schema = SchemaConfig(label="rating", categorical=["user", "item"])
    with pytest.raises(DataError, match=rf"r\.csv:{first_bad + 2}: label '{value}' is not 0 or 1 .*label_threshold"):
        list(open_source(DataConfig(source=str(path), schema=schema, test_fraction=0), "train", 100))


def test_a_string_column_declared_dense_is_an_error(tmp_path: Path) -> None:
    n = 600
    table = pa.table({"y": [i % 2 for i in range(n)], "city": [f"c{i % 9}" if i % 50 else "3" for i in range(n)], "item": [f"i{i % 4}" for i in range(n)]})
    pacsv.write_csv(table, tmp_path / "t.csv")
    schema = SchemaConfig(label="y", dense=["city"], categorical=["item"])
    with pytest.raises(DataError, match=r"t\.csv: column city is malformed in \d+ of the \d+ rows read; first: line 3: column city: 'c1' is not a number"):
        list(open_source(DataConfig(source=str(tmp_path / "t.csv"), schema=schema, test_fraction=0), "train", 64))


def test_a_run_whose_test_auc_is_undefined_exits_2(tmp_path: Path, capsys) -> None:
    lines = synthetic_rows(200)
    lines[-40:] = ["0" + line[1:] for line in lines[-40:]]  # the test split holds one class only
    path = write_lines(tmp_path / "t.txt", lines)
    over = [f"data.source={str(path)!r}", "data.test_rows=40", *TINY]
    code = main(["train", *[x for o in over for x in ("--set", o)], "--run-dir", str(tmp_path / "run"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("tierec: error: the test split of") and "one class only" in err


def test_several_config_files_merge_in_order_and_errors_name_full_keys(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text('[data]\nsource = "a.csv"\n[data.schema]\nlabel = "y"\ncategorical = ["u", "i"]\n[train]\nepochs = 3\n')
    (tmp_path / "b.toml").write_text("[train]\nepochs = 5\nbatch_size = 64\n")
    cfg = load_config([tmp_path / "a.toml", tmp_path / "b.toml"], ["train.batch_size=128"])
    assert (cfg.data.source, cfg.data.schema.label, cfg.data.schema.categorical) == ("a.csv", "y", ["u", "i"])
    assert (cfg.train.epochs, cfg.train.batch_size) == (5, 128)
    with pytest.raises(ConfigError, match=r"data\.schema\.preset sets .* leave data\.schema\.dense"):
        load_config(None, ["data.schema.preset=criteo", 'data.schema.dense=["x"]'])
    with pytest.raises(ConfigError, match=r"embedding\.optimizer\.lr must be positive"):
        load_config(None, ["embedding.optimizer.lr=0"])
