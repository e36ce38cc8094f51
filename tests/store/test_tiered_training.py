"""Training runs with tiered tables: the all-in-memory numbers under any layout, exact resume, metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tierec.config import ConfigError, load_config
from tierec.train.checkpoint import load_checkpoint
from tierec.train.trainer import Trainer

SMALL = [
    "data.synthetic.train_rows=2048",
    "data.synthetic.test_rows=1024",
    "data.synthetic.cardinality_scale=0.002",
    "train.batch_size=128",
    "train.progress=false",
    "train.threads=1",
    "embedding.dim=8",
    "model.name=deepfm",  # a wide (dim-1) collection as well: two tiered stores share the budget
]


def _mostly_on_disk(tmp_path: Path, prefetch: bool) -> list[str]:
    return SMALL + [
        "store.enabled=true",
        "store.memory_budget=48KiB",  # 8 KiB of it for the rows read ahead (store.prefetch)
        "store.cache_size=40KiB",
        "store.host_size=0",
        f"store.disk_path={tmp_path}",
        f"store.prefetch={str(prefetch).lower()}",
        "store.interval=5",
    ]


def _rows_by_id(run_dir: Path) -> dict[str, torch.Tensor]:
    tensors, _ = load_checkpoint(run_dir / "checkpoints")
    out = {}
    for k, v in tensors.items():
        if not k.startswith(("emb/", "wide/")) or ".store." in k:
            continue
        if k.endswith(".ids") or k.endswith(".weights") or ".opt." in k:
            table = k.rsplit(".", 1)[0] if ".opt." not in k else k.split(".opt.")[0]
            order = torch.argsort(tensors[f"{table}.ids"])
            out[k] = v[order]
        else:
            out[k] = v
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("prefetch", [False, True])
def test_mostly_on_disk_trains_like_all_in_memory(tmp_path: Path, prefetch: bool) -> None:
    plain = Trainer(load_config(None, SMALL), tmp_path / "plain").fit()
    tiered = Trainer(load_config(None, _mostly_on_disk(tmp_path, prefetch)), tmp_path / "tiered").fit()
    assert tiered["test_auc"] == plain["test_auc"] and tiered["test_logloss"] == plain["test_logloss"]
    assert tiered["final_train_loss"] == plain["final_train_loss"]
    _same(_rows_by_id(tmp_path / "plain"), _rows_by_id(tmp_path / "tiered"))
    store = tiered["store"]
    assert store["rows_disk"] > 2 * store["rows_cache"]  # most rows really live on disk
    assert store["disk_read_rows"] > 0 and store["evicted"] > 0
    if prefetch:
        assert store["pipeline"]["batches"] == tiered["steps"]
    records = [json.loads(x) for x in (tmp_path / "tiered" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert train and "store" in train[-1] and "C1" in train[-1]["store"]["tables"]
    c1 = train[-1]["store"]["tables"]["C1"]
    assert {"hit_rate", "rows_cache", "rows_host", "rows_disk", "new", "evicted", "disk_read_bytes", "disk_write_bytes"} <= c1.keys()


def test_resume_with_rows_on_disk_gives_the_uninterrupted_run(tmp_path: Path) -> None:
    over = _mostly_on_disk(tmp_path, prefetch=True) + ["store.ttl_steps=6", "store.admit_after=2"]
    full = Trainer(load_config(None, over), tmp_path / "full").fit()
    Trainer(load_config(None, over + ["train.max_steps=7"]), tmp_path / "part").fit()
    part = _rows_by_id(tmp_path / "part")
    assert any(k.endswith(".ids") and v.numel() for k, v in part.items())
    resumed = Trainer(load_config(None, over), tmp_path / "part", resume=True).fit()
    assert resumed["steps"] == full["steps"] == 16
    _same(_rows_by_id(tmp_path / "full"), _rows_by_id(tmp_path / "part"))
    assert resumed["test_auc"] == full["test_auc"]
    # statistics travel with the checkpoint: counters continue instead of restarting
    assert resumed["store"]["new"] == full["store"]["new"]


def test_store_config_errors_are_clear(tmp_path: Path) -> None:
    from tierec.train.components import Components

    with pytest.raises(ConfigError, match="exceeds memory_budget"):
        Components.build(load_config(None, ["store.enabled=true", "store.memory_budget=1MiB", "store.cache_size=2MiB"]), ["C1"], 1)
    with pytest.raises(ConfigError, match="unknown tables"):
        Components.build(load_config(None, ["store.enabled=true", 'store.tables=[{name="nope"}]']), ["C1"], 1)
    with pytest.raises(ConfigError, match="not a size"):
        load_config(None, ["store.memory_budget=lots"])


def test_per_table_layouts(tmp_path: Path) -> None:
    """C1 on its own store with a disk tier, C2 kept in memory, the rest in the default store."""
    from tierec.embedding import TableGroup
    from tierec.store import TieredGroup
    from tierec.train.components import Components

    over = [
        "store.enabled=true",
        "store.cache_size=64KiB",
        f'store.tables=[{{name="C1", cache_size="8KiB", host_size=0, disk_path="{tmp_path}"}}, {{name="C2", enabled=false}}]',
        "embedding.dim=4",
    ]
    parts = Components.build(load_config(None, over), ["C1", "C2", "C3", "C4"], 1)
    groups = {tuple(t.name for t in g.tables): g for g in parts.embeddings.groups}
    assert set(groups) == {("C1",), ("C2",), ("C3", "C4")}
    assert isinstance(groups[("C1",)], TieredGroup) and groups[("C1",)].spec.tiers() == ["cache", "disk"]
    assert type(groups[("C2",)]) is TableGroup
    assert groups[("C3", "C4")].spec.tiers() == ["cache", "host"]


def test_a_loaded_checkpoint_puts_its_hottest_rows_in_the_host_tier(tmp_path: Path) -> None:
    """Rows come back from a checkpoint in table order; after the load the host tier holds the hottest of the
    rows away from the fast tier (by the counts the checkpoint carried), the disk tier the rest."""
    from tierec.data import open_source
    from tierec.store.directory import LOC_DISK, LOC_HOST
    from tierec.train.checkpoint import Checkpoint
    from tierec.train.components import Components
    from tierec.train.state import restore_checkpoint

    over = SMALL + ["store.enabled=true", "store.cache_size=48KiB", "store.host_size=12KiB",
                    f"store.disk_path={tmp_path / 'disk'}", "store.decay=1.0"]
    Trainer(load_config(None, over), tmp_path / "run").fit()
    cfg = load_config(None, over + [f"store.disk_path={tmp_path / 'disk2'}"])
    probe = open_source(cfg.data, "train", cfg.train.batch_size)
    parts = Components.build(cfg, probe.feature_names, probe.n_dense)
    with Checkpoint(tmp_path / "run" / "checkpoints") as ckpt:
        restore_checkpoint(parts, ckpt)
    store = parts.embeddings.groups[0].tier_stores()[0]
    d = store.index
    live = d.live()
    host, disk = live[d.loc[live] == LOC_HOST], live[d.loc[live] == LOC_DISK]
    assert host.size > 100 and disk.size > 100  # both tiers hold rows: the test can tell them apart
    assert d.freq[host].min() >= d.freq[disk].max()
