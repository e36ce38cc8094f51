"""The library scorer against `tierec predict`: same rows, same scores (fp32 export: within 1e-6).

DLRM and DeepFM (first-order tables), on a synthetic CSV file and on the Criteo sample (skipped when
absent), with plain, pruned and tiered storage.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serving_helpers import (
    CRITEO_HEAD,
    CRITEO_TEST_ROWS,
    clicks_config,
    criteo_config,
    criteo_records,
    csv_records,
    predicted,
    storage_config,
    train,
    write_clicks_csv,
)
from tierec.serving.export import export_checkpoint
from tierec.serving.scorer import Scorer
from tierec.serving.table_file import TableFile


@pytest.fixture(scope="module")
def clicks(tmp_path_factory) -> Path:
    return write_clicks_csv(tmp_path_factory.mktemp("clicks") / "clicks.csv")


@pytest.mark.parametrize(("model", "storage"), [(m, s) for m in ("dlrm", "deepfm") for s in ("plain", "pruned", "tiered")]
                         + [("dlrm", "tiered+pruned")])
def test_scores_equal_predict_on_a_csv(clicks: Path, model: str, storage: str, tmp_path: Path) -> None:
    pooling = ['embedding.pooling="mean"'] if model == "deepfm" else []  # tags: mean over the bag
    summary = train(tmp_path / "run", clicks_config(clicks) + storage_config(storage, tmp_path) + [f'model.name="{model}"'] + pooling)
    if storage == "tiered":  # rows really lived on disk
        assert summary["store"]["rows_disk"] > 0, summary["store"]
    manifest = export_checkpoint(tmp_path / "run", tmp_path / "export")
    expected = predicted(tmp_path / "run", tmp_path / "p.csv")
    scores = Scorer.load(tmp_path / "export").score(csv_records(clicks))
    assert scores.shape == expected.shape and np.abs(scores - expected).max() <= 1e-6
    assert manifest.uses_wide == (model == "deepfm") and any(t.name.endswith(".wide") for t in manifest.tables) == manifest.uses_wide
    if "pruned" in storage:  # rows at their own dims, and some really pruned
        table = TableFile.open(tmp_path / "export" / manifest.table("user").file)
        dims = np.diff(table.array("offsets"))
        assert manifest.table("user").layout == "ragged" and dims.min() < 8 and dims.max() == 8


def test_typed_values_and_a_dict_of_columns_score_alike(clicks: Path, tmp_path: Path) -> None:
    train(tmp_path / "run", clicks_config(clicks) + ["train.max_steps=2"])
    export_checkpoint(tmp_path / "run", tmp_path / "export")
    scorer = Scorer.load(tmp_path / "export", mmap=False)
    records = csv_records(clicks)[:50]
    typed = [{**r, "price": float(r["price"]), "age": int(r["age"]) if r["age"] else None,
              "tags": r["tags"].split("|") if r["tags"] else []} for r in records]  # fmt: skip
    columns = {c: [r[c] for r in records] for c in records[0]}
    base = scorer.score(records)
    assert np.array_equal(base, scorer.score(typed)) and np.array_equal(base, scorer.score(columns))
    # empty values absent, or None, or every value as UTF-8 bytes: the same rows
    absent = [{k: v for k, v in r.items() if v != ""} for r in records]
    nones = [{k: None if v == "" else v for k, v in r.items()} for r in records]
    raw = [{k: v.encode() for k, v in r.items()} for r in records]
    assert absent != records and all(np.array_equal(base, scorer.score(x)) for x in (absent, nones, raw))
    unknown = scorer.score([{"price": "1", "user": "never-seen", "item": "-1"}])  # unknown ids read zeros
    assert unknown.shape == (1,) and 0 < unknown[0] < 1


@pytest.mark.skipif(not CRITEO_HEAD.exists(), reason="Criteo sample not available in ../shared/data")
@pytest.mark.parametrize(("model", "storage"), [("dlrm", "plain"), ("deepfm", "pruned"), ("dlrm", "tiered"), ("deepfm", "tiered")])
def test_scores_equal_predict_on_criteo(model: str, storage: str, tmp_path: Path) -> None:
    bigger = ["store.cache_size=256KiB", "store.memory_budget=400KiB"] if storage == "tiered" else []  # a batch's rows fit
    train(tmp_path / "run", criteo_config() + storage_config(storage, tmp_path) + bigger + [f'model.name="{model}"'])
    export_checkpoint(tmp_path / "run", tmp_path / "export")
    expected = predicted(tmp_path / "run", tmp_path / "p.csv", split="test")
    scores = Scorer.load(tmp_path / "export").score(criteo_records(CRITEO_HEAD, CRITEO_TEST_ROWS))
    assert scores.shape == expected.shape == (CRITEO_TEST_ROWS,) and np.abs(scores - expected).max() <= 1e-6


def test_scores_equal_predict_on_parquet_with_typed_values(clicks: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pacsv.read_csv(clicks, convert_options=pacsv.ConvertOptions(column_types={"user": pa.string(), "tags": pa.string()}))
    tags = pc.split_pattern(pc.fill_null(table.column("tags"), ""), "|")  # list<string> column: multi-valued
    tags = pa.array([[t for t in row if t] for row in tags.to_pylist()], pa.list_(pa.string()))
    table = table.set_column(table.schema.get_field_index("tags"), "tags", tags)
    path = tmp_path / "clicks.parquet"
    pq.write_table(table, path)
    over = [o for o in clicks_config(clicks) if not o.startswith("data.source")] + [f'data.source="{path}"']
    train(tmp_path / "run", over + ['model.name="deepfm"', "train.max_steps=6"])
    manifest = export_checkpoint(tmp_path / "run", tmp_path / "export")
    assert manifest.schema.values == "typed"
    expected = predicted(tmp_path / "run", tmp_path / "p.csv")
    scores = Scorer.load(tmp_path / "export").score(table.to_pylist())  # ints, floats, None, lists as Parquet holds them
    assert np.abs(scores - expected).max() <= 1e-6
