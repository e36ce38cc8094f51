"""Delta checkpoints (train.delta_every): a full checkpoint plus its deltas restores the state of a full
checkpoint at the last delta's step, bitwise, and training on from it equals the uninterrupted run."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tierec.config import ConfigError, load_config
from tierec.data import open_dataset
from tierec.embedding.changes import ChangeLog
from tierec.train.checkpoint import CheckpointError, load_checkpoint
from tierec.train.state import row_chunks, snapshot_state
from tierec.train.trainer import Trainer

SMALL = [
    "data.synthetic.train_rows=2048",
    "data.synthetic.test_rows=512",
    "data.synthetic.cardinality_scale=0.002",
    "train.batch_size=128",
    "train.progress=false",
    "train.plots=false",
    "train.threads=1",
    "embedding.dim=8",
    "model.name=deepfm",  # a wide (dim-1) collection too
]


def _tiered(tmp_path: Path) -> list[str]:
    return [
        "store.enabled=true",
        "store.memory_budget=40KiB",
        "store.cache_size=40KiB",
        "store.host_size=0",
        f"store.disk_path={tmp_path}",
        "store.interval=3",
        "store.ttl_steps=4",  # rows expire: deltas carry deleted ids
    ]


def _state(cfg, run_dir: Path, full: str) -> dict[str, torch.Tensor]:
    """Everything a run restores from checkpoint ``full`` plus its deltas: dense state, rows by id, position."""
    trainer = Trainer(cfg, run_dir)
    probe = open_dataset(cfg.data).source("train", cfg.train.batch_size)
    parts = trainer._build(probe)
    meta = trainer._restore_with_deltas(parts, run_dir / "checkpoints" / full)
    tensors, _ = snapshot_state(parts)
    # a restore's own I/O adds to the tiers' disk/host read and write counters (columns 9-12), a full
    # checkpoint's more than a delta's: compared are the training's counters
    out = {k: v[:9] if k.endswith("store.counters") else v for k, v in tensors.items() if "store.clock" not in k}
    out["position"] = torch.tensor([meta["position"][k] for k in ("step", "epoch", "batch_in_epoch")])
    rows: dict[str, list[dict[str, torch.Tensor]]] = {}
    for label, records in row_chunks(parts):
        rows.setdefault(label, []).append(records)
    for label, chunks in rows.items():
        ids = torch.cat([c["ids"] for c in chunks])
        order = torch.argsort(ids)
        for key in chunks[0]:
            if key != "store.slot":
                out[f"{label}.{key}"] = _by_id(torch.cat([c[key] for c in chunks]), order, chunks, key)
    return out


def _by_id(values: torch.Tensor, order: torch.Tensor, chunks: list[dict[str, torch.Tensor]], key: str) -> torch.Tensor:
    """A record field in id order; a pruned row's ``chunked.*`` values (its own dims' worth) move with it."""
    if not key.startswith("chunked."):
        return values[order]
    dims = torch.cat([c["dims"] for c in chunks]).long()
    per_row = (dims * values.numel() // max(int(dims.sum()), 1)).tolist()
    parts = torch.split(values, per_row)
    return torch.cat([parts[i] for i in order.tolist()]) if parts else values


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if k.endswith(".store.freq"):
            # access counts of rows unchanged since the last publication are decayed on restore: on the
            # cold tiers' quantised counts, where the run may have decayed a row's exact count in the fast tier
            close = torch.isclose(a[k], b[k], rtol=0.15)
            assert bool(close.all()) and int((a[k] != b[k]).sum()) <= max(5, a[k].numel() // 20), k
        else:
            assert torch.equal(a[k], b[k]), k


# pruned rows: dims, importance and claims change at every pruning step (step 3, 6, 9), rows at dim 0 are
# evicted (deleted in the delta), and the decay of the rows a delta does not carry is caught up on restore
PRUNED = ["prune.enabled=true", "prune.chunk=4", "prune.every=3", "prune.target_ratio=2", "prune.min_dim=0"]


def _storage(tmp_path: Path, storage: str) -> list[str]:
    tiered = _tiered(tmp_path) if "tiered" in storage else []
    if "pruned" in storage:
        return [o for o in tiered if not o.startswith("store.ttl_steps")] + PRUNED
    return tiered


@pytest.mark.parametrize("storage", ["plain", "tiered", "pruned", "tiered+pruned"])
def test_full_plus_deltas_is_the_full_checkpoint_and_trains_on_the_same(tmp_path: Path, storage: str) -> None:
    tiered = storage == "tiered"
    over = SMALL + _storage(tmp_path, storage)
    # deltas: step 2 (full: no base yet), 4 (delta of 2), 5 (full), 6, 8 (deltas of 5), 9 (the end: full)
    with_deltas = over + ["train.checkpoint_every=5", "train.delta_every=2"]
    Trainer(load_config(None, with_deltas + ["train.max_steps=9"]), tmp_path / "d").fit()
    ckpts = tmp_path / "d" / "checkpoints"
    names = sorted(p.name for p in ckpts.iterdir() if p.name.startswith(("step_", "delta_")))
    # step 2 was pruned (keep = 2), and its delta (step 4) with it
    assert names == ["delta_00000006_of_00000005", "delta_00000008_of_00000005", "step_00000005", "step_00000009"]
    tensors, delta = load_checkpoint(ckpts / "delta_00000008_of_00000005")
    assert delta["delta"] == {"base": 5, "previous": 6} and delta["position"]["step"] == 8
    changed = tensors["emb/C1.ids"].numel()
    assert 0 < changed < load_checkpoint(ckpts / "step_00000005")[0]["emb/C1.ids"].numel() + changed
    if storage != "plain":  # store.ttl_steps expired rows, or the pruner evicted rows at dim 0: the deltas name them
        deleted = [load_checkpoint(ckpts / n)[0] for n in names if n.startswith("delta_")]
        assert any(k.startswith("deleted/") and v.numel() for t in deleted for k, v in t.items())

    # the reference: a full checkpoint at step 8 of the same training
    ref_cfg = load_config(None, over + ["train.checkpoint_every=8", "train.max_steps=9"])
    Trainer(ref_cfg, tmp_path / "r").fit()
    _same(_state(ref_cfg, tmp_path / "r", "step_00000008"), _state(ref_cfg, tmp_path / "d", "step_00000005"))

    # a crash before step 9's full checkpoint: --resume takes step 5 plus deltas 6 and 8 and trains on
    shutil.rmtree(ckpts / "step_00000009")
    (ckpts / "latest").write_text("step_00000005\n")
    whole = Trainer(load_config(None, over), tmp_path / "u").fit()
    resumed = Trainer(load_config(None, with_deltas), tmp_path / "d", resume=True).fit()
    assert resumed["steps"] == whole["steps"] == 16
    assert resumed["test_auc"] == whole["test_auc"]
    u, d = load_checkpoint(tmp_path / "u" / "checkpoints")[0], load_checkpoint(ckpts)[0]
    for k in u:
        if k.endswith(".ids") and k.startswith("emb/"):
            table = k[: -len(".ids")]
            ou, od = torch.argsort(u[k]), torch.argsort(d[k])
            field = "chunked.weights" if f"{table}.dims" in u else "weights"  # a pruned row: its own dims
            uw, dw = (_by_id(t[f"{table}.{field}"], o, [{"dims": t.get(f"{table}.dims")}], field) for t, o in ((u, ou), (d, od)))
            assert torch.equal(u[k][ou], d[k][od]) and torch.equal(uw, dw)


def test_a_damaged_delta_ends_the_chain(tmp_path: Path) -> None:
    cfg = SMALL + ["train.checkpoint_every=5", "train.delta_every=2", "train.max_steps=9"]
    Trainer(load_config(None, cfg), tmp_path / "d").fit()
    ckpts = tmp_path / "d" / "checkpoints"
    shutil.rmtree(ckpts / "step_00000009")
    (ckpts / "latest").write_text("step_00000005\n")
    rows = ckpts / "delta_00000008_of_00000005" / "tensors.safetensors"
    data = bytearray(rows.read_bytes())
    data[-1] ^= 1
    rows.write_bytes(bytes(data))
    said: list[str] = []
    trainer = Trainer(load_config(None, cfg), tmp_path / "d", resume=True, echo=said.append)
    probe = open_dataset(trainer.cfg.data).source("train", 128)
    meta = trainer._restore_with_deltas(trainer._build(probe), ckpts / "step_00000005")
    assert meta["position"]["step"] == 6
    assert any("delta_00000008_of_00000005" in s and "resuming from step 6" in s for s in said)
    with pytest.raises(CheckpointError, match="is a delta checkpoint"):
        trainer._restore_from(trainer._build(probe), ckpts / "delta_00000006_of_00000005")


def test_change_log_last_event_wins() -> None:
    log = ChangeLog()
    log.changed(np.array([1, 2, 3]), np.array([0, 0, 1]))
    log.deleted(np.array([2, 3]), np.array([0, 1]))
    log.changed(np.array([3]), np.array([1]))
    c = log.since_mark(2)
    assert [x.tolist() for x in c.changed] == [[1], [3]] and [x.tolist() for x in c.deleted] == [[2], []]


def test_delta_every_refuses_lossy_tiers() -> None:
    with pytest.raises(ConfigError, match="train.delta_every.*store.cold_precision"):
        load_config(None, ["train.delta_every=2", "store.cold_precision=bf16"])
